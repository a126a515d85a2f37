"""An emulated GPU of speed s runs a task in its run time over s, as the planner and the
simulator assume, and the run time it teaches the planner is in speed-1.0 ms, the unit
of ``exec_ms`` (real worker, real Redis)."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery.emulated import make_app
from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.needs import profile_key
from compass_celery.testing import worker_logs

pytestmark = pytest.mark.redis


def test_a_fast_emulated_gpu_runs_faster_and_teaches_speed_one_times(compass_redis_url,
                                                                      compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_MODELS": json.dumps({"m": 100})}
    w = compass_workers("compass_celery.emulated_app", "g0@fast", "--compass-emulate-gpu-mb",
                        "1000", "--compass-preload", "m", "--compass-speed", "2", env=env)
    app = make_app(compass_redis_url, compass_models={"m": 100}, compass_snapshot_ttl_s=0)
    try:
        wait_until(lambda: app.compass.store.snapshot(time.time(), 5.0).workers or None, 30,
                   "the worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    dag = Dag(app, "fast")
    # 400 ms at speed 1.0; nothing declared, so the worker's measurement is what is learned
    dag.node("n", app.signature("emulated.infer", args=("m", 400, None)), model="m")
    job = dag.apply_async()
    job.get(timeout=30)
    run = job.placement()["n"]["run_ms"]
    assert 180 <= run <= 300, (run, worker_logs([w]))  # 400 / 2, not 400
    learned = app.compass.store.snapshot(time.time(), 5.0).profiles[
        profile_key("emulated.infer", "m")]
    assert 360 <= learned <= 500, learned  # in speed-1.0 ms: what a plan divides by 2
