"""Backlog charges written in batches off the enqueue path, against a real Redis."""

from __future__ import annotations

import time

from celery import Celery

from compass_celery import Compass
from compass_celery.planner.types import WorkerView
from compass_celery.state.charges import ChargeBatcher
from compass_celery.state.store import RedisStateStore


def view(name: str, prefix: str = "chg") -> WorkerView:
    """A live worker record with room for every model."""
    return WorkerView(name=name, queue=f"{prefix}.w.{name}", gpu_total_mb=16000.0,
                      gpu_free_mb=16000.0, resident=frozenset({"m"}), heartbeat=time.time())


def backlogs(store: RedisStateStore) -> dict[str, float]:
    return {w.name: w.backlog_ms for w in store.snapshot(time.time(), 30.0).workers}


def test_a_release_landing_before_its_charge_nets_out(compass_redis_url: str) -> None:
    store = RedisStateStore(compass_redis_url, "chg")
    store.publish(view("w1"))
    store.charge("w1", -120.0)  # the worker's release got there first
    assert backlogs(store) == {"w1": 0.0}  # read as zero meanwhile
    store.charge("w1", 120.0)
    store.charge("w1", 40.0)
    assert backlogs(store) == {"w1": 40.0}  # not 160: the two commuted
    store.set_backlog("w1", -5.0)  # a reconcile never writes below zero
    store.charge("w1", 10.0)
    assert backlogs(store) == {"w1": 10.0}


def test_routed_charges_reach_redis_in_batches(compass_redis_url: str) -> None:
    app = Celery("chg", broker="memory://", set_as_current=False)
    app.conf.update(compass_redis_url=compass_redis_url, compass_key_prefix="chg",
                    compass_models={"m": 100.0}, compass_heartbeat_timeout_s=30.0)
    c = Compass(app)

    @app.task(shared=False, name="t.infer", compass_model="m", compass_exec_ms=50)
    def infer() -> None:
        """A task the router places."""

    for name in ("a", "b"):
        c.store.publish(view(name))
    for _ in range(20):
        infer.apply_async()
    batcher = c.router.charges
    assert isinstance(batcher, ChargeBatcher)
    deadline = time.time() + 5
    while sum(backlogs(c.store).values()) < 1000.0 and time.time() < deadline:
        time.sleep(0.01)
    assert backlogs(c.store) == {"a": 500.0, "b": 500.0}  # this process spread them evenly
    assert 1 <= batcher.flushes <= 20 and batcher.dropped == 0
    assert batcher.flush() == 0  # nothing left behind


def test_pipelined_charges_land_once_after_redis_forgets_its_scripts(
        compass_redis_url: str) -> None:
    """Pipelines run their scripts without asking SCRIPT EXISTS first; a Redis that lost its
    scripts (restarted, flushed) gets them loaded again, and each charge still lands once."""
    import redis

    store = RedisStateStore(compass_redis_url, "flush")
    store.publish(view("w1", "flush"))
    raw = redis.Redis.from_url(compass_redis_url)
    for transaction in (False, True):
        raw.script_flush()
        pipe = store.client.pipeline(transaction=transaction)
        store.charge("w1", 30.0, pipe=pipe)
        pipe.hset("flush:other", "x", 1)
        store.charge("w1", 12.0, pipe=pipe)
        store.execute(pipe)
    assert backlogs(store) == {"w1": 84.0}  # 2 x (30 + 12): none lost, none doubled
    exists = raw.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0)
    pipe = store.client.pipeline(transaction=False)
    store.charge("w1", -4.0, pipe=pipe)
    store.record_run("t|m", 10.0, 0.3, pipe=pipe)
    store.execute(pipe)
    after = raw.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0)
    assert after == exists  # no round trip asking whether the scripts are there
    assert backlogs(store) == {"w1": 80.0}


def test_a_read_folds_in_the_gathered_charges_and_waits_for_none(compass_redis_url: str
                                                                 ) -> None:
    """A read writes nothing: charges gathered but not yet written are folded into what it
    read (this process counts them at once), written by the batcher afterwards, and then
    read from Redis, never twice."""
    from compass_celery.state.reader import SnapshotReader

    store = RedisStateStore(compass_redis_url, "fold")
    for name in ("a", "b"):
        store.publish(view(name, "fold"))
    reader = SnapshotReader(store, ttl_s=0.0, heartbeat_timeout_s=30.0)
    batcher = ChargeBatcher(store, linger_s=30.0)  # its own thread would wait 30 s
    reader.charges = batcher
    reader.get()
    batcher.add("a", 25.0)
    batcher.add("a", 5.0)
    batcher.add("b", 7.0)
    folded = {w.name: w.backlog_ms for w in reader.get().workers}
    assert folded == {"a": 30.0, "b": 7.0}  # counted here at once
    other = RedisStateStore(compass_redis_url, "fold")
    assert backlogs(other) == {"a": 0.0, "b": 0.0}  # the read wrote nothing
    assert batcher.flush() == 2 and batcher.dropped == 0
    assert backlogs(other) == {"a": 30.0, "b": 7.0}
    assert {w.name: w.backlog_ms for w in reader.get().workers} == folded  # not doubled
