"""Each per-worker counter hash holds one kind of member: BACKLOG a worker's total, QUEUED
its queued work per priority level, FORMING its waiting inputs per batch key; and what the
ledger charges reads back the same from Redis and from the in-process store."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from compass_celery import ledger
from compass_celery.jobs.keys import once_keys
from compass_celery.placement import Decision
from compass_celery.planner.types import WorkerView
from compass_celery.state import keys
from compass_celery.state.mirror import CHANGE_LOG_SIZE, epoch_candidate
from compass_celery.state.scripts import register_script
from compass_celery.state.store import MemoryStateStore, RedisStateStore

pytestmark = pytest.mark.redis

QP = "compass.w."
WORKERS = ("a", "b|c@host")  # a name with the batch key's own separator in it


def _view(name: str) -> WorkerView:
    return WorkerView(name=name, queue=QP + name, gpu_total_mb=1000.0, gpu_free_mb=500.0,
                      heartbeat=time.time())


def _sends() -> list[Decision]:
    return [Decision(task="t", model="m", worker=w, queue=QP + w, policy="compass",
                     charge_ms=ms, priority=level, batch=batch)
            for w in WORKERS
            for ms, level, batch in ((10.0, 0, ""), (20.0, 5, "t|m"), (5.0, 5, "t|m"),
                                     (7.0, None, "u|m"))]


def _charge(store, sends: list[Decision]) -> None:
    for d in sends:
        ledger.post(store, ledger.sent(d))
    ledger.started(store, sends[-1])  # one of them started: it no longer waits


def _members(client: redis.Redis, template: str) -> list[str]:
    return [m.decode() for m in client.hkeys(keys.key(template, "compass"))]


def test_each_counter_hash_holds_one_kind_of_member(compass_redis_url):
    store = RedisStateStore(compass_redis_url, queue_prefix=QP)
    client = redis.Redis.from_url(compass_redis_url)
    for w in WORKERS:
        store.publish(_view(w))
    _charge(store, _sends())
    # a submission's sources (once.lua) and a reconcile write the same hashes
    once = register_script(client, "changelog", "once")
    extra = Decision(task="t", model="m", worker="a", queue=QP + "a", policy="compass",
                     charge_ms=3.0, priority=9, batch="v|m")
    args: list = [60, epoch_candidate(), CHANGE_LOG_SIZE]
    for table, member, amount in ledger.sent(extra):
        args += [keys.COUNTERS[table][1], member, amount]
    once(keys=once_keys("compass", "job:sources"), args=args)
    store.set_backlog(keys.queued_member("a", 3), 4.0, table="queued")
    store.set_backlog(keys.forming_member("a", "w|m"), 2, table="forming")

    assert sorted(_members(client, keys.BACKLOG)) == sorted(WORKERS)
    assert sorted(_members(client, keys.PENDING)) == []
    queued = [keys.split_member(m) for m in _members(client, keys.QUEUED)]
    assert {w for w, _ in queued} == set(WORKERS)
    assert all(level.isdigit() for _, level in queued)
    forming = [keys.split_member(m) for m in _members(client, keys.FORMING)]
    assert {w for w, _ in forming} == set(WORKERS)
    assert {b for _, b in forming} == {"t|m", "u|m", "v|m", "w|m"}
    a = next(w for w in store.snapshot(time.time(), 30.0).workers if w.name == "a")
    assert a.backlog_ms == 45.0
    assert dict(a.queued_ms) == {0: 10.0, 3: 4.0, 5: 25.0, 9: 3.0}
    assert dict(a.queued_inputs) == {"t|m": 2, "u|m": 1, "v|m": 1, "w|m": 2}


def test_redis_and_memory_stores_read_the_ledger_alike(compass_redis_url):
    stores = [RedisStateStore(compass_redis_url, queue_prefix=QP), MemoryStateStore()]
    got = []
    for store in stores:
        for w in WORKERS:
            store.publish(_view(w))
        _charge(store, _sends())
        snap = store.snapshot(time.time(), 30.0)
        got.append([(w.name, w.backlog_ms, dict(w.queued_ms), dict(w.queued_inputs))
                    for w in snap.workers])
        store.remove(WORKERS[0])
        snap = store.snapshot(time.time(), 30.0)
        got.append([(w.name, dict(w.queued_ms)) for w in snap.workers])
    assert got[0] == got[2] and got[1] == got[3]
    assert got[0][0] == ("a", 42.0, {0: 10.0, 5: 25.0}, {"t|m": 2, "u|m": 1})
    assert got[0][1][3] == {"t|m": 2}  # its last send started: no longer waits


def test_learned_values_follow_one_rule_in_both_stores(compass_redis_url):
    """The learning rules (run-time EWMA with its outlier reset, plan-error quantile step)
    are Python's alone: both stores give the same values on the same runs, a second
    writer's update in between included, and no state script carries a rule."""
    from pathlib import Path

    redis_store = RedisStateStore(compass_redis_url, queue_prefix=QP)
    other = RedisStateStore(compass_redis_url, queue_prefix=QP)
    memory = MemoryStateStore()
    runs = [100.0, 120.0, 500.0, 90.0, 95.0, 10.0, 12.0, 0.0, 0.0, 40.0]
    for i, ms in enumerate(runs):
        writer = other if i % 3 == 2 else redis_store  # another process wrote meanwhile
        writer.record_run("t|m", ms, 0.3)
        memory.record_run("t|m", ms, 0.3)
        writer.record_plan_error("interactive", ms - 60.0, 0.9, 25.0)
        memory.record_plan_error("interactive", ms - 60.0, 0.9, 25.0)
    pipe = redis_store.client.pipeline(transaction=False)
    redis_store.record_run("t|m", 44.0, 0.3, pipe=pipe)  # on a pipeline, settled by execute
    redis_store.execute(pipe)
    memory.record_run("t|m", 44.0, 0.3)
    got = redis_store.snapshot(time.time(), 30.0)
    want = memory.snapshot(time.time(), 30.0)
    assert got.profiles == pytest.approx(want.profiles)
    assert got.plan_errors == pytest.approx(want.plan_errors)
    client = redis.Redis.from_url(compass_redis_url)
    assert json.loads(client.hget(keys.key(keys.PROFILES, "compass"), "t|m"))["n"] == 11
    assert client.hkeys(keys.key(keys.PROFILES, "compass")) == [b"t|m"]  # no plan error
    lua = Path(__file__).resolve().parents[2] / "compass_celery" / "state" / "lua"
    for path in lua.glob("*.lua"):
        code = path.read_text()
        assert not any(word in code for word in ("alpha", "tau", "exec_ms", "error_ms")), \
            f"{path.name} carries a learning rule: keep it in Python (state/records.py)"


def test_a_pipelined_update_found_stale_rides_the_next_pipeline_not_a_round_trip(
        private_redis_url):
    """An update on a pipeline that another process's write made stale costs no round
    trip of its own: the rule is applied to the value found and the write goes at the
    front of the next pipelined update; two stale ones of a field apply in order. The
    values end as one writer applying the runs in the order they landed would leave
    them (a carried run lands after the other writer's later one)."""
    redis_store = RedisStateStore(private_redis_url, queue_prefix=QP)
    other = RedisStateStore(private_redis_url, queue_prefix=QP)
    client = redis.Redis.from_url(private_redis_url)  # no one else's commands counted
    profiles = keys.key(keys.PROFILES, "compass")
    client.delete(profiles)

    def learn(store: Any, key: str, ms: float, pipe: Any = None) -> None:
        store.record_run(key, ms, 0.3, pipe=pipe)

    def n(key: str) -> int:
        raw = client.hget(profiles, key)
        return json.loads(raw)["n"] if raw else 0

    learn(redis_store, "t|m", 100.0)
    learn(other, "t|m", 200.0)  # redis_store's last write is stale now
    pipe = redis_store.client.pipeline(transaction=False)
    learn(redis_store, "t|m", 50.0, pipe)
    client.config_resetstat()
    redis_store.execute(pipe)
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == 1  # no retry
    assert n("t|m") == 2  # carried, not written yet
    learn(other, "t|m", 300.0)  # stale again: the carried write and the next one both
    pipe = redis_store.client.pipeline(transaction=False)
    learn(redis_store, "t|m", 70.0, pipe)
    redis_store.execute(pipe)
    assert n("t|m") == 3
    pipe = redis_store.client.pipeline(transaction=False)
    learn(redis_store, "u|m", 10.0, pipe)  # another field's update carries them
    redis_store.execute(pipe)
    assert n("t|m") == 5 and n("u|m") == 1
    memory = MemoryStateStore()
    for key, ms in (("t|m", 100.0), ("t|m", 200.0), ("t|m", 300.0), ("t|m", 50.0),
                    ("t|m", 70.0), ("u|m", 10.0)):
        memory.record_run(key, ms, 0.3)
    got = redis_store.snapshot(time.time(), 30.0).profiles
    assert got == pytest.approx(memory.snapshot(time.time(), 30.0).profiles)
    client.delete(profiles)


def test_planned_work_is_read_by_level_and_forgotten_with_its_worker(compass_redis_url):
    """A job's planned-but-unsent nodes count in PENDING and, by level, in PENDING_QUEUED
    (``ledger.planned``), through once.lua as a submission writes them; both stores read
    them alike, and forgetting a worker forgets its planned work by level too."""
    client = redis.Redis.from_url(compass_redis_url)
    once = register_script(client, "changelog", "once")
    stores = [RedisStateStore(compass_redis_url, queue_prefix=QP), MemoryStateStore()]
    got = []
    for store in stores:
        for w in WORKERS:
            store.publish(_view(w))
        entries = [*ledger.planned("a", 500.0, 0), *ledger.planned("a", 40.0, 9),
                   *ledger.planned(WORKERS[1], 7.0, None)]
        if isinstance(store, RedisStateStore):
            args: list = [60, epoch_candidate(), CHANGE_LOG_SIZE]
            for table, member, amount in entries:
                args += [keys.COUNTERS[table][1], member, amount]
            once(keys=once_keys("compass", "job:plan"), args=args)
        else:
            ledger.post(store, entries)
        snap = store.snapshot(time.time(), 30.0)
        got.append([(w.name, w.pending_ms, dict(w.pending_queued_ms)) for w in snap.workers])
        store.remove("a")
        got.append([(w.name, dict(w.pending_queued_ms)) for w in
                    store.snapshot(time.time(), 30.0).workers])
    assert got[0] == got[2] and got[1] == got[3]
    assert got[0][:2] == [("a", 540.0, {0: 500.0, 9: 40.0}), (WORKERS[1], 7.0, {})]
    assert _members(client, keys.PENDING_QUEUED) == []  # forgotten with its worker
