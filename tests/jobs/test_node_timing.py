"""What a job node's timing says it spent: queue wait, model load and run time apart,
each counted once (real worker, real Redis)."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery.emulated import make_app
from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs

pytestmark = pytest.mark.redis


def test_a_load_is_not_counted_as_queue_wait(compass_redis_url, compass_workers):
    # a 900 MB model at 1,000 MB/s: a 900 ms load on an idle worker with nothing queued
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_MODELS": json.dumps({"m": 900})}
    w = compass_workers("compass_celery.emulated_app", "g0@timing", "--compass-emulate-gpu-mb",
                        "2000", "--compass-load-mb-per-s", "1000", env=env)
    app = make_app(compass_redis_url, compass_models={"m": 900}, compass_snapshot_ttl_s=0)
    wait_until(lambda: app.compass.store.snapshot(time.time(), 5.0).workers or None, 30,
               "the worker's record")
    dag = Dag(app, "timing")
    dag.node("n", app.signature("emulated.infer", args=("m", 50, None)), model="m", exec_ms=50)
    job = dag.apply_async()
    job.get(timeout=30)
    where = job.placement()["n"]
    assert where["load_ms"] == pytest.approx(900, abs=150), (where, worker_logs([w]))
    assert where["queued_ms"] < 300, where  # it waited for nothing: the load is its own term
    assert where["run_ms"] == pytest.approx(50, abs=40)


def test_sources_on_one_worker_run_in_the_order_the_plan_started_them(compass_redis_url,
                                                                      compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_MODELS": json.dumps({"m": 100})}
    w = compass_workers("compass_celery.emulated_app", "g0@order", "--compass-emulate-gpu-mb",
                        "2000", "--compass-preload", "m", env=env)
    app = make_app(compass_redis_url, compass_models={"m": 100}, compass_snapshot_ttl_s=0)
    wait_until(lambda: app.compass.store.snapshot(time.time(), 5.0).workers or None, 30,
               "the worker's record")
    dag = Dag(app, "order")
    short = dag.node("short", app.signature("emulated.infer", args=("m", 50, None)),
                     model="m", exec_ms=50)
    long = dag.node("long", app.signature("emulated.infer", args=("m", 200, None)),
                    model="m", exec_ms=200)
    dag.node("join", app.signature("emulated.step", args=("m", 5)), after=[short, long],
             model="m", exec_ms=5)
    job = dag.apply_async()
    job.get(timeout=30)
    plan = json.loads(app.compass.store.client.hget(job.keys.job, "plan"))
    where = job.placement()
    planned_first = min(("short", "long"), key=lambda n: plan[n]["start_ms"])
    ran_first = min(("short", "long"), key=lambda n: where[n]["started"])
    assert planned_first == "long"  # the longest path first
    assert ran_first == planned_first, (plan, where, worker_logs([w]))
