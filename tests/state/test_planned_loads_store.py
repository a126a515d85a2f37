"""Every producer's planned loads in the store (PLANNED_LOADS): published by one process,
in every reader's next snapshot while they are not over, trimmed once long over; a
producer's flush sends them with its charges."""

from __future__ import annotations

import time

import pytest
import redis

from compass_celery.planner.types import WorkerView
from compass_celery.state import keys
from compass_celery.state.charges import ChargeBatcher
from compass_celery.state.reader import SnapshotReader
from compass_celery.state.store import PLANNED_KEEP_S, MemoryStateStore, RedisStateStore

QP = "compass.w."


def _view(name: str) -> WorkerView:
    return WorkerView(name=name, queue=QP + name, gpu_total_mb=1000.0, gpu_free_mb=1000.0,
                      heartbeat=time.time())


@pytest.mark.redis
def test_a_planned_load_is_in_every_readers_snapshot_until_it_is_over(compass_redis_url):
    writer = RedisStateStore(compass_redis_url, queue_prefix=QP, prefix="pl1")
    reader = RedisStateStore(compass_redis_url, queue_prefix=QP, prefix="pl1")
    writer.publish(_view("w1"))
    now = time.time()
    assert reader.snapshot(now, 30.0).planned_loads == {}
    writer.plan_loads([("w1", "captioner", now + 30.0), ("w2", "ocr", now - 1.0)])
    snap = reader.snapshot(time.time(), 30.0)
    # the one not over yet, on any reader; the one over is left out
    assert snap.planned_loads == {"w1": {"captioner": pytest.approx(now + 30.0)}}
    # a later plan of the same load replaces it
    writer.plan_loads([("w1", "captioner", now + 40.0)])
    assert reader.snapshot(time.time(), 30.0).planned_loads["w1"]["captioner"] == \
        pytest.approx(now + 40.0)


@pytest.mark.redis
def test_loads_long_over_are_trimmed_by_the_next_write(compass_redis_url):
    store = RedisStateStore(compass_redis_url, queue_prefix=QP, prefix="pl2")
    client = redis.Redis.from_url(compass_redis_url)
    key = keys.key(keys.PLANNED_LOADS, "pl2")
    now = time.time()
    store.plan_loads([("w1", "a", now - PLANNED_KEEP_S - 5.0), ("w1", "b", now - 1.0)])
    store.plan_loads([("w2", "c", now + 5.0)])
    members = {m.decode() for m in client.zrange(key, 0, -1)}
    assert members == {keys.loads_member("w1", "b"), keys.loads_member("w2", "c")}


@pytest.mark.redis
def test_a_flush_publishes_its_planned_loads_beside_its_charges(
        private_redis_url):
    store = RedisStateStore(private_redis_url, queue_prefix=QP, prefix="pl3")
    other = RedisStateStore(private_redis_url, queue_prefix=QP, prefix="pl3")
    store.publish(_view("w1"))
    batcher = ChargeBatcher(store, linger_s=30.0)  # its own thread would wait 30 s
    client = redis.Redis.from_url(private_redis_url)
    batcher.add("w1", 100.0)
    batcher.plan_load("w1", "ocr", time.time() - 1.0)
    batcher.flush()  # connections made, scripts loaded: the next flush sends only its own
    ends = time.time() + 20.0
    batcher.add("w1", 20.0)
    batcher.plan_load("w1", "captioner", ends)
    batcher.plan_load("w1", "captioner", ends - 5.0)  # an earlier end does not shorten it
    before = _calls(client)
    assert batcher.flush() == 1
    calls = _calls(client)
    # one script call for the charge, and the loads' trim beside it (their ZADD is
    # counted with the change log's own)
    assert (calls["evalsha"] - before["evalsha"], calls["zremrangebyscore"]
            - before["zremrangebyscore"], calls["eval"] - before["eval"]) == (1, 1, 0)
    snap = other.snapshot(time.time(), 30.0)
    assert snap.workers[0].backlog_ms == 120.0
    assert snap.planned_loads == {"w1": {"captioner": pytest.approx(ends)}}
    batcher.close()


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {"calls": 0})["calls"])
            for c in ("evalsha", "eval", "zremrangebyscore")}


def test_a_read_folds_this_processs_unpublished_loads_and_the_published_ones():
    store = MemoryStateStore()
    store.publish(_view("w1"))
    store.publish(_view("w2"))
    now = time.time()
    store.plan_loads([("w2", "ocr", now + 10.0)])  # another producer's, published

    class Unflushed:  # the batcher's contract: what it has not written yet comes back
        def read_through(self, read):
            return read(), {(keys.LOADS, keys.loads_member("w1", "captioner")): now + 5.0}

    reader = SnapshotReader(store, ttl_s=60.0, heartbeat_timeout_s=30.0)
    reader.charges = Unflushed()  # type: ignore[assignment]
    seen: list[dict] = []
    reader.fold = lambda snap: (seen.append(dict(snap.planned_loads)), snap)[1]
    reader.get()
    assert seen == [{"w1": {"captioner": now + 5.0}, "w2": {"ocr": now + 10.0}}]


def test_a_garbled_planned_load_is_skipped():
    from compass_celery.state.mirror import planned_by_worker

    flat = [b"w1\x1fcaptioner", b"12.5", b"w1\x1focr", b"inf", b"w2\x1fa", b"nan",
            b"w3\x1fb", b"soon", b"nosep", b"3.0", b"w4\x1fc"]
    assert planned_by_worker(flat) == {"w1": {"captioner": 12.5}}
