"""A Dag node whose run time nobody declared is planned with the one learned from
measured runs, as a plain task's routing is (real worker, real Redis)."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.testing import worker_logs
from tests.support.emulated import one_emulated

pytestmark = pytest.mark.redis


def test_an_undeclared_node_is_planned_with_its_learned_run_time(compass_redis_url,
                                                                 compass_workers):
    app, w = one_emulated(compass_redis_url, compass_workers, "g0@learn", {"m": 100},
                          "--compass-emulate-gpu-mb", "1000", "--compass-preload", "m")

    def planned_run_ms() -> float:
        dag = Dag(app, "learn")
        # the body sleeps 300 ms; the planner is told nothing of it
        dag.node("n", app.signature("emulated.infer", args=("m", 300, None)), model="m")
        job = dag.apply_async()
        job.get(timeout=30)
        return json.loads(app.compass.store.client.hget(job.keys.job, "plan"))["n"]["run_ms"]

    first = planned_run_ms()
    assert first == app.compass.settings["default_exec_ms"]  # nothing learned yet
    # a producer plans on a snapshot at most this old: wait until it postdates the run
    settings = app.compass.settings
    time.sleep(settings["snapshot_ttl_s"] + settings["snapshot_refresh_ahead_s"] + 0.05)
    second = planned_run_ms()
    assert 250 <= second <= 450, (second, worker_logs([w]))  # the measured run, not 100


def test_a_declared_run_time_still_wins_over_the_learned_one(compass_redis_url,
                                                             compass_workers):
    app = one_emulated(compass_redis_url, compass_workers, "g0@declared", {"m": 100},
                       "--compass-emulate-gpu-mb", "1000", "--compass-preload", "m")[0]
    for _ in range(2):
        dag = Dag(app, "declared")
        dag.node("n", app.signature("emulated.infer", args=("m", 200, None)), model="m",
                 exec_ms=40)
        job = dag.apply_async()
        job.get(timeout=30)
        plan = json.loads(app.compass.store.client.hget(job.keys.job, "plan"))
        assert plan["n"]["run_ms"] == 40
