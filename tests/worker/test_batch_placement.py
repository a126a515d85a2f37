"""Batching-aware placement on real workers: each worker's count of waiting inputs per
batch key lives in Redis beside its backlog; the router reads it, places a batched task
into the batch forming there and charges it only what it adds; the count falls as the
inputs start and a reconcile puts it right."""

from __future__ import annotations

import time

import pytest
import redis

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.signals import task_placed
from compass_celery.state import keys
from compass_celery.state.keys import forming_member
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_started
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "big,small"]
KEY = "j.embed|small"  # j.embed: 20 ms for one input, 2 ms for each other (declared)


def _one_worker(url, compass_workers, name, **conf):
    w = compass_workers("tests.support.jobapp", name, *GPU, env={"COMPASS_BROKER_URL": url})
    app = make_app(url, compass_snapshot_ttl_s=0.0, **conf)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1,
                   30, "the worker")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    return app, w


def _count(app, worker: str) -> float:
    raw = redis.Redis.from_url(app.conf.broker_url).hget(
        keys.key(keys.FORMING, "compass"), forming_member(worker, KEY))
    return float(raw or 0)


def _placed(app, send):
    """The decisions ``send()`` made on ``app``."""
    got = []

    def note(sender=None, decision=None, **kw):
        if sender is app.compass:
            got.append(decision)
    task_placed.connect(note, weak=False)
    try:
        out = send()
    finally:
        task_placed.disconnect(note)
    return got, out


def test_inputs_waiting_are_counted_joined_and_charged_what_they_add(compass_redis_url,
                                                                     compass_workers):
    app, w = _one_worker(compass_redis_url, compass_workers, "bp1@batch")
    busy = app.tasks["j.wait"].apply_async((0, 1.0), compass={"exec_ms": 1000})
    wait_started(app, busy)
    embed = app.tasks["j.embed"]
    decisions, results = _placed(app, lambda: [embed.delay(f"t{i}") for i in range(6)])
    assert [d.batch for d in decisions] == [KEY] * 6
    # the first opens a batch behind the busy task at its full run; the rest join it
    assert decisions[0].charge_ms == 20.0 and "joins" not in decisions[0].reason
    assert [d.charge_ms for d in decisions[1:]] == [2.0] * 5, [d.reason for d in decisions]
    assert all("joins a forming batch" in d.reason for d in decisions[1:])
    # every input waiting is counted in Redis, and a fresh read sees the count
    wait_until(lambda: _count(app, "bp1@batch") == 6, 10, "the count of waiting inputs")
    view = app.compass.store.snapshot(time.time(), 3.0).workers[0]
    assert view.queued_inputs == {KEY: 6}
    busy.get(timeout=20)
    assert [r.get(timeout=20) for r in results] == [f"e(t{i})" for i in range(6)]
    wait_until(lambda: _count(app, "bp1@batch") == 0, 10, "the count back to 0")
    assert app.compass.store.snapshot(time.time(), 3.0).workers[0].queued_inputs == {}


def test_placement_blind_to_batches_charges_each_input_a_full_run(compass_redis_url,
                                                                  compass_workers):
    app, w = _one_worker(compass_redis_url, compass_workers, "bp2@batch",
                         compass_batch_aware=False)
    busy = app.tasks["j.wait"].apply_async((0, 0.5), compass={"exec_ms": 500})
    wait_started(app, busy)
    decisions, results = _placed(app, lambda: [app.tasks["j.embed"].delay(f"u{i}")
                                               for i in range(4)])
    assert [d.charge_ms for d in decisions] == [20.0] * 4
    assert not any("joins" in d.reason for d in decisions)
    busy.get(timeout=20)
    assert [r.get(timeout=20) for r in results] == [f"e(u{i})" for i in range(4)]
    wait_until(lambda: _count(app, "bp2@batch") == 0, 10, "the count back to 0")


def test_dag_nodes_are_counted_and_a_wrong_count_is_reconciled(compass_redis_url,
                                                               compass_workers):
    app, w = _one_worker(compass_redis_url, compass_workers, "bp3@batch")
    client = redis.Redis.from_url(compass_redis_url)
    busy = app.tasks["j.wait"].apply_async((0, 1.0), compass={"exec_ms": 1000})
    wait_started(app, busy)
    jobs = []
    for i in range(3):
        dag = Dag(app, f"emb{i}")
        dag.node("e", app.tasks["j.embed"].s(f"q{i}"))
        jobs.append(dag.apply_async())
    wait_until(lambda: _count(app, "bp3@batch") == 3, 10, "the job nodes counted")
    assert [j.placement()["e"]["planned"] for j in jobs] == ["bp3@batch"] * 3
    busy.get(timeout=20)
    assert [j.get(timeout=30) for j in jobs] == [{"e": f"e(q{i})"} for i in range(3)]
    # a count gone wrong (a lost release, a garbled value) is set right by a reconcile
    client.hset(keys.key(keys.FORMING, "compass"), forming_member("bp3@batch", KEY), "junk")
    assert app.compass.store.snapshot(time.time(), 3.0).workers[0].queued_inputs == {}
    client.hset(keys.key(keys.FORMING, "compass"), forming_member("bp3@batch", KEY), 7)
    wait_until(lambda: _count(app, "bp3@batch") == 0, 10, "the reconcile")
    # and again, long after the count was last set to 0 with nothing waiting: the elapsed
    # time is the subject (over two reconcile intervals of 1 s), not an event to wait on
    time.sleep(2.5)
    client.hset(keys.key(keys.FORMING, "compass"), forming_member("bp3@batch", KEY), 4)
    wait_until(lambda: _count(app, "bp3@batch") == 0, 10, "a later reconcile")
