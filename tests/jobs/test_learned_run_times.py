"""A Dag node whose run time nobody declared is planned with the one learned from
measured runs, as a plain task's routing is (real worker, real Redis)."""

from __future__ import annotations

import json

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.needs import profile_key
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
    # a producer plans on its snapshot (at most TTL plus read-ahead old): wait until the
    # snapshot it reads holds the learned run time, as the next plan's read will
    learned = profile_key("emulated.infer", "m")
    wait_until(lambda: learned in app.compass.reader.get().profiles, 10,
               "the producer's snapshot to hold the learned run time")
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
