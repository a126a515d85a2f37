"""Faults with real processes: a worker SIGKILLed mid-run, duplicate deliveries, retries."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import redis

from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import JobKeys
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000"]
ENV = {"COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}


def start_cluster(url, compass_workers, names):
    env = {"COMPASS_BROKER_URL": url, **ENV}
    ws = [compass_workers("tests.support.jobapp", n, *GPU, "--compass-preload", "big,small",
                          env=env) for n in names]
    app = make_app(url, compass_snapshot_ttl_s=0.0, compass_heartbeat_timeout_s=1.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 1.0).workers)
                   == len(names), 30, "fault-test workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.log = redis.Redis.from_url(url)
    return app, ws


def test_sigkilled_worker_tasks_are_replaced_nothing_lost(compass_redis_url, compass_workers):
    app, ws = start_cluster(compass_redis_url, compass_workers, ["k1@faults", "k2@faults"])
    heavy = app.tasks["j.heavy"]  # 300 ms on "big", which both hold
    # a burst: each worker gets a running task and a queue behind it
    results = [heavy.delay(i) for i in range(8)]
    placed = Counter(app.compass.placement(r.id).worker for r in results)
    assert placed["k1@faults"] >= 3, placed
    wait_until(lambda: app.log.llen("ran") >= 2, 10, "the first tasks to start")
    ws[0].kill()  # SIGKILL: one task running, more waiting in its own queue
    values = sorted(r.get(timeout=30) for r in results)
    assert values == list(range(8)), worker_logs(ws)
    # the survivor ran everything that had not finished on the dead worker
    assert app.compass.store.snapshot(time.time(), 1.0).workers[0].name == "k2@faults"
    assert app.log.llen(app.compass.queue_for("k1@faults")) == 0


def test_sigkilled_worker_mid_job_job_still_completes(compass_redis_url, compass_workers):
    app, ws = start_cluster(compass_redis_url, compass_workers, ["d1@faults", "d2@faults"])
    jobs = []
    for i in range(6):
        dag = Dag(app, "chain")
        a = dag.node("a", app.tasks["j.heavy"].s(i), output_kb=100)
        dag.node("b", app.tasks["j.add"].s(10), after=[a])
        jobs.append(dag.apply_async())
    wait_until(lambda: app.log.llen("ran") >= 2, 10, "the first tasks to start")
    ws[0].kill()
    assert sorted(j.get(timeout=40)["b"] for j in jobs) == [10 + i for i in range(6)]
    # each job's successor was sent and ran once, even when its source ran twice
    ran = Counter(e.decode().rsplit(":", 1)[0] for e in app.log.lrange("ran", 0, -1))
    for j in jobs:
        assert ran[f"{j.id}:b"] == 1


def test_duplicate_completion_is_idempotent(compass_redis_url, compass_workers):
    app, ws = start_cluster(compass_redis_url, compass_workers, ["u1@faults"])
    dag = Dag(app, "dup")
    a = dag.node("a", app.tasks["j.src"].s(5))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async()
    assert job.get(timeout=20) == {"b": 6}
    # deliver a's message again, as a redelivery would
    keys = JobKeys.of("compass", job.id)
    nodes = {"a": json.loads(app.log.hget(keys.job, "n:a"))}
    app.send_task("j.src", args=[5], queue=app.compass.queue_for("u1@faults"),
                  headers={"compass_job": {"id": job.id, "node": "a"}})
    wait_until(lambda: Counter(e.decode().rsplit(":", 1)[0]
                               for e in app.log.lrange("ran", 0, -1))[f"{job.id}:a"] == 2,
               10, "the duplicate delivery to run")
    # a negative check: a second b, had the duplicate's completion sent one, would start
    # within a hop on an idle worker; half a second gives it that chance
    time.sleep(0.5)
    ran = Counter(e.decode().rsplit(":", 1)[0] for e in app.log.lrange("ran", 0, -1))
    assert ran[f"{job.id}:b"] == 1  # the successor was not sent a second time
    assert nodes["a"]["succs"] == ["b"]
    assert "completion of" in ws[0].log() and "duplicate" in ws[0].log()


def test_retry_is_replaced_not_pinned(compass_redis_url, compass_workers):
    app, ws = start_cluster(compass_redis_url, compass_workers, ["r1@faults", "r2@faults"])
    res = app.tasks["j.flaky"].delay("x")
    assert res.get(timeout=20) == "x"
    tries = [e.decode().split("|") for e in app.log.lrange("flaky", 0, -1)]
    assert len(tries) == 3, tries
    # the first try made its worker look busy: the retry was re-placed on the other one
    assert tries[0][0] != tries[1][0], tries
    assert tries[1][1] == app.compass.queue_for(tries[1][0])
