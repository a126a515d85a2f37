"""An emulated GPU of speed s runs a task in its run time over s, as the planner and the
simulator assume, and the run time it teaches the planner is in speed-1.0 ms, the unit
of ``exec_ms`` (real worker, real Redis)."""

from __future__ import annotations

import time

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.needs import profile_key
from compass_celery.testing import worker_logs
from tests.support.emulated import one_emulated

pytestmark = pytest.mark.redis


def test_a_fast_emulated_gpu_runs_faster_and_teaches_speed_one_times(compass_redis_url,
                                                                      compass_workers):
    app, w = one_emulated(compass_redis_url, compass_workers, "g0@fast", {"m": 100},
                          "--compass-emulate-gpu-mb", "1000", "--compass-preload", "m",
                          "--compass-speed", "2")
    dag = Dag(app, "fast")
    # 400 ms at speed 1.0; nothing declared, so the worker's measurement is what is learned
    dag.node("n", app.signature("emulated.infer", args=("m", 400, None)), model="m")
    job = dag.apply_async()
    job.get(timeout=30)
    run = job.placement()["n"]["run_ms"]
    assert 180 <= run <= 300, (run, worker_logs([w]))  # 400 / 2, not 400
    # the job ends in one script and the run is learned on the worker's bookkeeping
    # pipeline right after it: the job's end can be read first
    key = profile_key("emulated.infer", "m")
    learned = wait_until(
        lambda: app.compass.store.snapshot(time.time(), 5.0).profiles.get(key), 10,
        "the learned run time")
    assert 360 <= learned <= 500, learned  # in speed-1.0 ms: what a plan divides by 2
