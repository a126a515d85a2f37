"""Compass state, jobs and profiles on a real three-master Redis Cluster.

The broker (and Celery's result backend) stay on a plain private ``redis-server``, as
kombu's Redis transport needs; compass's own keys live on the cluster
(``compass_redis_url="redis+cluster://..."``). Real worker processes route, run jobs
and fail them there; the incremental reader reads deltas there.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis
from redis.cluster import key_slot

from compass_celery.jobs import JobFailed
from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import JobKeys
from compass_celery.local import wait_until
from compass_celery.placement import Decision
from compass_celery.planner.types import WorkerView
from compass_celery.state import keys
from compass_celery.state.connection import connect
from compass_celery.state.store import RedisStateStore
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytest_plugins = ["tests.support.cluster_fixtures"]  # compass_redis_cluster, compass_cluster_url
pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000"]


@pytest.fixture
def cluster_app(compass_redis_url, compass_cluster_url, compass_workers):
    """Two job workers: broker and results on the plain Redis, compass state on the cluster."""
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_STATE_URL":
           compass_cluster_url}
    ws = [compass_workers("tests.support.jobapp", "a@rc", *GPU, "--compass-preload",
                          "big,small", env=env),
          compass_workers("tests.support.jobapp", "b@rc", *GPU, "--compass-preload",
                          "small", env=env)]
    app = make_app(compass_redis_url, compass_redis_url=compass_cluster_url,
                   compass_snapshot_ttl_s=0.0)
    store = app.compass.store
    try:
        wait_until(lambda: len(store.snapshot(time.time(), 3.0).workers) == 2, 30,
                   "two job workers on the cluster state")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.state = store.client
    app.broker = redis.Redis.from_url(compass_redis_url)
    app.workers = ws
    return app


def runs(app, job_id: str) -> Counter:
    entries = [e.decode().split(":") for e in app.state.lrange("ran", 0, -1)]
    return Counter(n for j, n, _ in entries if j == job_id)


def test_routing_and_worker_records_live_on_the_cluster(cluster_app):
    app = cluster_app
    records = app.state.hgetall(keys.key(keys.WORKERS, "compass"))
    assert {k.decode() for k in records} == {"a@rc", "b@rc"}
    assert app.state.zcard(keys.key(keys.BEATS, "compass")) == 2
    assert not app.broker.exists(keys.key(keys.WORKERS, "compass"))  # nothing on the broker
    res = app.tasks["j.src"].delay(7)
    assert res.get(timeout=30) == 7, worker_logs(app.workers)
    decision = app.compass.placement(res.id)
    assert decision is not None and not decision.fallback
    assert decision.worker in ("a@rc", "b@rc")
    assert decision.queue == f"compass.w.{decision.worker}"
    # the worker learned the run time on the cluster, and the snapshot reads it back
    wait_until(lambda: app.compass.store.snapshot(time.time(), 3.0).profiles, 10,
               "a learned run time")


def test_dag_job_with_released_successors_and_a_join(cluster_app):
    app = cluster_app
    dag = Dag(app, "diamond")
    a = dag.node("a", app.tasks["j.src"].s(10))
    s = dag.node("s", app.tasks["j.src"].s(100))  # a second source
    b = dag.node("b", app.tasks["j.add"].s(1), after=[a])
    c = dag.node("c", app.tasks["j.add"].s(2), after=[a])
    dag.node("d", app.tasks["j.collect"].s(), after=[c, b, s])
    job = dag.apply_async()
    deadlines = keys.key(keys.JOB_DEADLINES, "compass")
    assert app.state.zscore(deadlines, job.id) is not None  # running (three hops to go)
    assert job.get(timeout=30) == {"d": [12, 11, 100]}, worker_logs(app.workers)
    assert runs(app, job.id) == Counter({"a": 1, "s": 1, "b": 1, "c": 1, "d": 1})
    where = job.placement()
    assert set(where) == {"a", "s", "b", "c", "d"}
    assert all(w["worker"] in ("a@rc", "b@rc") for w in where.values())
    jk = JobKeys.of("compass", job.id)
    assert len({key_slot(k.encode()) for k in jk.all()}) == 1
    assert {k.decode() for k in app.state.hkeys(jk.tasks)} == {"a", "s", "b", "c", "d"}
    assert all(not v.startswith(b"?") for v in app.state.hvals(jk.tasks))  # all confirmed
    # ended: out of the deadline set (its slot is not the job's: removed apart from it)
    wait_until(lambda: app.state.zscore(deadlines, job.id) is None, 5, "the entry to go")
    # the job's planned work was released as it was sent: nothing stays pending
    snap = app.compass.store.snapshot(time.time(), 3.0)
    assert all(w.pending_ms == 0 for w in snap.workers), snap.workers


def test_job_failure_on_the_cluster(cluster_app):
    app = cluster_app
    dag = Dag(app, "failing")
    a = dag.node("a", app.tasks["j.src"].s(1))
    b = dag.node("b", app.tasks["j.boom"].s(), after=[a])
    dag.node("c", app.tasks["j.add"].s(1), after=[b])
    job = dag.apply_async()
    with pytest.raises(JobFailed) as err:
        job.get(timeout=30)
    assert err.value.info["node"] == "b", worker_logs(app.workers)
    assert "boom on 1" in err.value.info["exc"]
    assert job.status == "FAILURE"
    assert "c" not in runs(app, job.id)
    # c's planned work is released by the failure (just after the state that wakes us)
    try:
        wait_until(lambda: all(w.pending_ms == 0 for w in app.compass.store.snapshot(
            time.time(), 3.0).workers), 5, "the failure to release c's pending work")
    except TimeoutError:
        raise AssertionError(app.compass.store.snapshot(time.time(), 3.0).workers) from None


def test_a_dead_workers_queue_is_drained_with_state_on_the_cluster(cluster_app):
    app = cluster_app
    app.workers[1].kill()  # b@rc dies with tasks queued for it
    # Only once it is gone: a BRPOP still pending from a process being killed can take a
    # message that nobody will ever ack (kombu's Redis transport; see OPERATIONS).
    app.workers[1].proc.wait(10)
    time.sleep(0.2)
    queue = app.compass.queue_for("b@rc")
    results = []
    for i in range(5):
        decision = Decision(task="j.src", model="small", worker="b@rc", queue=queue,
                            policy="compass", charge_ms=5.0, run_ms=5.0)
        results.append(app.send_task("j.src", args=[i], queue=queue,
                                     headers={"compass": decision.as_header()}))
    assert sorted(r.get(timeout=40) for r in results) == list(range(5)), \
        worker_logs(app.workers)
    dead = keys.key(keys.DEAD_QUEUES, "compass")
    assert app.state.zscore(dead, queue) is not None  # marked on the cluster by the leader
    assert not app.state.hexists(keys.key(keys.WORKERS, "compass"), "b@rc")
    assert app.broker.llen(queue) == 0


def _view(name: str, free: float = 1000.0) -> WorkerView:
    return WorkerView(name=name, queue=f"compass.w.{name}", gpu_total_mb=4000.0,
                      gpu_free_mb=free, resident=frozenset(), speed=1.0, heartbeat=time.time(),
                      load_mb_per_s=1000.0, host_load_mb_per_s=1000.0, net_mb_per_s=1000.0,
                      device="emulated")


def test_incremental_snapshot_reads_on_the_cluster(compass_cluster_url):
    writer = RedisStateStore(compass_cluster_url, queue_prefix="compass.w.")
    reader = RedisStateStore(compass_cluster_url, queue_prefix="compass.w.")
    for name in ("a", "b", "c"):
        writer.publish(_view(name))
    snap = reader.snapshot(time.time(), 30.0)
    assert [w.name for w in snap.workers] == ["a", "b", "c"]
    assert (reader.full_reads, reader.records_fetched) == (1, 3)
    writer.charge("b", 40.0)
    writer.add_pending("c", 7.0)
    writer.publish(_view("a", free=500.0))
    writer.record_run("t|m", 12.0, 0.3)
    snap = reader.snapshot(time.time(), 30.0)
    assert [(w.name, w.gpu_free_mb, w.backlog_ms, w.pending_ms) for w in snap.workers] == [
        ("a", 500.0, 0.0, 0.0), ("b", 1000.0, 40.0, 0.0), ("c", 1000.0, 0.0, 7.0)]
    assert snap.profiles == {"t|m": 12.0}
    assert (reader.full_reads, reader.records_fetched) == (1, 4)  # a delta: one record
    writer.remove("b")
    snap = reader.snapshot(time.time(), 30.0)
    assert [w.name for w in snap.workers] == ["a", "c"] and reader.full_reads == 1
    # the state keys share one slot; a plain client sees them on one node only
    client = connect(compass_cluster_url)
    state = [keys.key(t, "compass") for t in (keys.WORKERS, keys.BEATS, keys.BACKLOG,
                                              keys.PENDING, keys.PROFILES, keys.STATE_LOG,
                                              keys.CHANGES, keys.QUEUED, keys.FORMING,
                                              keys.PLAN_ERRORS)]
    assert {client.cluster_keyslot(k) for k in state} == {key_slot(state[0].encode())}


def test_job_keys_spread_over_the_cluster(compass_cluster_url):
    client = connect(compass_cluster_url)
    slots = set()
    for i in range(64):
        jk = JobKeys.of("compass", f"job{i}")
        job_slots = {client.cluster_keyslot(k) for k in jk.all()}
        assert len(job_slots) == 1, jk
        slots |= job_slots
    assert len(slots) > 32  # jobs are not all in one slot, nor with the state
