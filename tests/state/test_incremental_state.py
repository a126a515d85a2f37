"""A reader fetches only what changed since its last read, and still sees everything."""

from __future__ import annotations

import json
import time

import pytest
import redis

from compass_celery.planner.types import WorkerView
from compass_celery.state import keys, scripts
from compass_celery.state import store as state_store
from compass_celery.state.scripts import register_script
from compass_celery.state.store import RedisStateStore

pytestmark = pytest.mark.redis

QP = "compass.w."


def _view(name: str, free: float = 500.0) -> WorkerView:
    return WorkerView(name=name, queue=QP + name, gpu_total_mb=1000.0, gpu_free_mb=free,
                      heartbeat=1.0)


def _snap(store: RedisStateStore, timeout: float = 30.0):
    return store.snapshot(time.time(), timeout)


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


@pytest.fixture
def stores(compass_redis_url):
    writer = RedisStateStore(compass_redis_url, queue_prefix=QP)
    reader = RedisStateStore(compass_redis_url, queue_prefix=QP)
    return writer, reader, redis.Redis.from_url(compass_redis_url)


def test_a_reader_sees_new_updated_and_removed_workers(stores):
    writer, reader, _ = stores
    writer.publish(_view("a"))
    assert [w.name for w in _snap(reader).workers] == ["a"]
    writer.publish(_view("b"))
    writer.publish(_view("a", free=100.0))
    writer.charge("b", 40.0)
    writer.add_pending("a", 7.0)
    snap = _snap(reader)
    assert [(w.name, w.gpu_free_mb, w.backlog_ms, w.pending_ms) for w in snap.workers] == [
        ("a", 100.0, 0.0, 7.0), ("b", 500.0, 40.0, 0.0)]
    writer.remove("a")
    assert [w.name for w in _snap(reader).workers] == ["b"]
    writer.record_run("t|m", 80.0, 0.3)
    assert _snap(reader).profiles == {"t|m": 80.0}
    assert reader.full_reads == 1  # all of it incremental after the first read


def test_an_incremental_read_fetches_only_changed_records(stores):
    writer, reader, client = stores
    for i in range(20):
        writer.publish(_view(f"w{i:02d}"))
    assert len(_snap(reader).workers) == 20
    fetched, hgetall = reader.records_fetched, _calls(client, "hgetall")
    for i in range(20):  # idle workers publish the same bytes: nothing to fetch
        writer.publish(_view(f"w{i:02d}"))
    first = _snap(reader)
    assert reader.records_fetched == fetched
    writer.publish(_view("w03", free=10.0))
    snap = _snap(reader)
    assert reader.records_fetched == fetched + 1
    assert _calls(client, "hgetall") == hgetall  # no full read of any hash
    assert {w.name: w.gpu_free_mb for w in snap.workers}["w03"] == 10.0
    before = {w.name: w for w in first.workers}
    assert all(w is before[w.name] for w in snap.workers if w.name != "w03")  # kept
    assert _snap(reader).workers is snap.workers  # nothing changed: the same tuple


def test_full_reload_after_the_data_is_lost(stores):
    writer, reader, client = stores
    writer.publish(_view("a"))
    writer.publish(_view("b"))
    assert len(_snap(reader).workers) == 2
    epoch = client.hget("{compass}:state-log", "epoch")
    client.flushall()  # a restart without persistence: the version counter starts over
    for name in ("c", "d", "e"):  # ... and passes the reader's version again
        writer.publish(_view(name))
    writer.remove("d")
    writer.remove("e")
    assert client.hget("{compass}:state-log", "epoch") != epoch
    fulls = reader.full_reads
    assert [w.name for w in _snap(reader).workers] == ["c"]
    assert reader.full_reads == fulls + 1
    client.flushall()  # and nobody has written since
    assert _snap(reader).workers == ()


def test_liveness_is_exact_without_reading_every_beat(stores):
    writer, reader, client = stores
    writer.publish(_view("a"))
    writer.publish(_view("b"))
    assert len(_snap(reader, 30.0).workers) == 2
    # a 30 s heartbeat timeout: a loaded machine takes a while between two reads, and
    # only the lapsed beat (100 s old) may make a worker dead here
    client.zadd("{compass}:beats", {"a": time.time() - 100})  # a's beat lapses
    snap = _snap(reader, 30.0)
    assert [w.name for w in snap.workers] == ["b"]
    assert snap.dead == (("a", QP + "a"),) and "dead" in snap.skipped[0]
    writer.publish(_view("a"))  # it beats again (same bytes: nothing logged)
    assert [w.name for w in _snap(reader, 30.0).workers] == ["a", "b"]


def test_records_written_behind_the_log_are_still_seen(stores):
    writer, reader, client = stores
    writer.publish(_view("a"))
    assert len(_snap(reader).workers) == 1
    client.hset("{compass}:workers", "junk@x", b"{not json")  # no logged change
    snap = _snap(reader)
    assert any("junk@x" in why and "not valid JSON" in why for why in snap.skipped)
    forged = json.dumps({"name": "evil@x", "queue": "other-app", "gpu_total_mb": 1.0,
                         "gpu_free_mb": 1.0, "speed": 1.0, "load_mb_per_s": 1.0,
                         "host_load_mb_per_s": 1.0, "net_mb_per_s": 1.0, "heartbeat": 0.0})
    client.hset("{compass}:workers", "evil@x", forged)
    snap = _snap(reader)
    assert [w.name for w in snap.workers] == ["a"] and snap.dead == ()
    assert any("forged" in why for why in snap.skipped)


def test_a_reader_that_fell_off_the_change_log_reads_everything(stores, monkeypatch):
    import compass_celery.state.store

    writer, reader, _ = stores
    monkeypatch.setattr(compass_celery.state.store, "CHANGE_LOG_SIZE", 3)  # what writers keep
    writer.publish(_view("a"))
    assert len(_snap(reader).workers) == 1
    fulls = reader.full_reads
    for i in range(6):
        writer.publish(_view(f"n{i}"))
    assert len(_snap(reader).workers) == 7
    assert reader.full_reads == fulls + 1


def test_reported_heartbeats_are_refreshed_a_slice_at_a_time(stores):
    writer, reader, _ = stores
    reader.beat_sync_s = 0.0  # a pass over the beats on every read
    writer.publish(_view("a"))
    first = _snap(reader).workers[0].heartbeat
    time.sleep(0.3)
    writer.publish(_view("a"))  # same bytes: only the beat moves, nothing is logged
    _snap(reader)
    assert _snap(reader).workers[0].heartbeat >= first + 0.25


def test_a_compass_apps_store_fetches_nothing_for_workers_that_only_beat(compass_redis_url):
    """Routing needs liveness, not heartbeat times: the app's store takes beats only with
    its full reads, so an idle fleet's beats cost its reads nothing, and death is still
    seen on the next read."""
    from celery import Celery

    from compass_celery import Compass
    from compass_celery.state.store import FULL_READ_S

    app = Celery("beats", broker="memory://", set_as_current=False)
    app.conf.update(compass_redis_url=compass_redis_url)
    store = Compass(app).store
    assert isinstance(store, RedisStateStore) and store.beat_sync_s == FULL_READ_S
    writer = RedisStateStore(compass_redis_url)
    for name in ("a", "b"):
        writer.publish(_view(name))
    first = {w.name: w.heartbeat for w in _snap(store).workers}
    monitor = RedisStateStore(compass_redis_url)  # a store that shows heartbeats
    _snap(monitor)
    time.sleep(0.3)
    for s in (store, monitor):
        s._mirror._synced -= 10.0  # as if the default beat pass (5 s) were due
    egress = []
    for _ in range(3):
        for name in ("a", "b"):
            writer.publish(_view(name))  # same bytes: only the beats move
        before = _egress(store)
        info = _egress(store) - before  # what one INFO reply itself adds
        snap = _snap(store)
        egress.append(_egress(store) - before - 2 * info)
    assert {w.name: w.heartbeat for w in snap.workers} == first  # not fetched
    assert all(w.heartbeat > first[w.name] for w in _snap(monitor).workers)  # fetched there
    assert max(egress) < 200  # no record, no beat: the reply's fixed fields only
    time.sleep(0.3)
    assert {w.name for w in _snap(store, timeout=0.2).workers} == set()  # both gone quiet


def _egress(store: RedisStateStore) -> int:
    return int(store.client.info("stats")["total_net_output_bytes"])


def _backlog(snap, name: str) -> float:
    return next(w.backlog_ms for w in snap.workers if w.name == name)


def test_a_producer_does_not_fetch_back_its_own_charges(stores):
    writer, reader, client = stores
    for name in ("a", "b", "c"):
        writer.publish(_view(name))
    _snap(reader)
    reader.charge("a", 40.0)  # one round trip of its own
    pipe = reader.client.pipeline(transaction=False)  # and batched, as the router does
    reader.charge("b", 15.0, pipe=pipe)
    reader.charge("b", 5.0, pipe=pipe)
    reader.execute(pipe)
    snap = _snap(reader)
    assert (_backlog(snap, "a"), _backlog(snap, "b"), _backlog(snap, "c")) == (40.0, 20.0, 0.0)
    assert reader._mirror.own_skipped == 2  # a and b: left out of the read, values known
    assert _backlog(_snap(writer), "b") == 20.0  # another process reads them from Redis


def test_a_pipeline_keeps_no_compass_state_and_a_forgotten_script_runs_once(stores):
    """What compass queues on a pipeline (its scripts, its own counter changes) it keeps in
    its own tables, never in the pipeline's attributes; run_pipeline still loads and
    re-runs, once, a script that Redis forgot (restart, SCRIPT FLUSH)."""
    writer, reader, client = stores
    writer.publish(_view("a"))
    _snap(reader)
    learn = register_script(writer.client, "changelog", "learn")
    pipe = writer.client.pipeline(transaction=False)
    writer.charge("a", 30.0, pipe=pipe)
    pipe.hset("other", "x", 1)
    learn(keys=[keys.key(keys.PROFILES, "compass"), keys.key(keys.STATE_LOG, "compass"),
                keys.key(keys.CHANGES, "compass")],
          args=["t|m", "", json.dumps({"exec_ms": 80.0, "n": 1}), "f:t|m", "e", 100],
          client=pipe)
    assert not [k for k in vars(pipe) if "compass" in k]
    assert len(scripts._queued[pipe]) == 2 and len(state_store._own_queued[pipe]) == 1
    client.script_flush()
    writer.execute(pipe)  # both scripts found missing: loaded, each run once
    assert pipe not in scripts._queued and pipe not in state_store._own_queued
    assert [w.backlog_ms for w in _snap(reader).workers] == [30.0]  # not lost, not doubled
    assert json.loads(client.hget(keys.key(keys.PROFILES, "compass"), "t|m"))["n"] == 1
    assert writer._mirror.own["b:a"][2] == b"30"  # its reply reached the writer's mirror


def test_a_script_is_registered_once_per_client_and_still_runs_after_a_flush(stores):
    """register_script hands back the same script for the same client and names (a job's
    submission registers once.lua on every job); another client gets its own, and the
    kept script loads itself again after Redis forgot it."""
    writer, reader, client = stores
    once = register_script(writer.client, "changelog", "once")
    assert register_script(writer.client, "changelog", "once") is once
    assert register_script(writer.client, "once") is not once
    other = redis.Redis(connection_pool=writer.client.connection_pool)
    assert register_script(other, "changelog", "once") is not once
    writer.publish(_view("a"))
    _snap(reader)
    client.script_flush()
    counters = register_script(writer.client, "changelog", "counters")
    assert counters is writer._counters  # the store's own, registered when it connected
    writer.charge("a", 30.0)  # run directly: NOSCRIPT, loaded, run once
    assert [w.backlog_ms for w in _snap(reader).workers] == [30.0]


def test_a_change_by_someone_else_after_the_own_one_is_fetched(stores):
    writer, reader, _ = stores
    writer.publish(_view("a"))
    _snap(reader)
    reader.charge("a", 40.0)
    writer.charge("a", -25.0)  # the worker's release lands after the producer's charge
    assert _backlog(_snap(reader), "a") == 15.0
    assert reader._mirror.own_skipped == 0
    writer.set_backlog("a", 3.0)  # a reconcile, then the producer charges again
    reader.charge("a", 10.0)
    assert _backlog(_snap(reader), "a") == 13.0
    assert reader._mirror.own_skipped == 1


def test_an_own_change_older_than_the_last_read_is_not_applied(stores):
    writer, reader, _ = stores
    writer.publish(_view("a"))
    _snap(reader)
    pipe = reader.client.pipeline(transaction=False)
    reader.charge("a", 40.0, pipe=pipe)
    late = pipe.execute()[0]  # its reply, not yet handed to the mirror
    writer.set_backlog("a", 3.0)  # a reconcile overwrites it
    assert _backlog(_snap(reader), "a") == 3.0
    reader._mirror.note_own("b:a", late)  # the reply arrives only now (another thread)
    writer.publish(_view("b"))  # something else changes: the next read is a delta
    assert _backlog(_snap(reader), "a") == 3.0


def test_own_changes_from_before_the_data_was_lost_are_dropped(stores):
    writer, reader, client = stores
    writer.publish(_view("a"))  # version 1
    _snap(reader)
    pipe = reader.client.pipeline(transaction=False)
    reader.charge("a", 40.0, pipe=pipe)  # version 2
    late = pipe.execute()[0]
    client.flushall()  # Redis restarted empty: a new epoch, versions start over
    writer.publish(_view("a"))  # version 1 again
    _snap(reader)
    writer.charge("a", 1.0)  # version 2 again, the same number as the lost charge
    reader._mirror.note_own("b:a", late)  # an old epoch's version: must not be trusted
    assert _backlog(_snap(reader), "a") == 1.0


def test_counters_that_move_on_every_task_do_not_change_the_record(stores):
    writer, reader, client = stores
    writer.publish(_view("a"), pid=7, hits=1)
    _snap(reader)
    fetched = reader.records_fetched
    for hits in range(2, 12):  # a busy worker: its cache counters move on every publish
        writer.publish(_view("a"), pid=7, hits=hits)
        _snap(reader)
    assert reader.records_fetched == fetched  # the record's bytes never changed
    assert json.loads(client.hget("{compass}:worker-stats", "a")) == {"pid": 7, "hits": 11}
    assert "hits" not in json.loads(client.hget("{compass}:workers", "a"))
    writer.remove("a")
    assert client.hget("{compass}:worker-stats", "a") is None


def test_a_read_rewrites_only_the_workers_that_changed_in_place(stores):
    writer, reader, _ = stores
    for name in ("c", "a", "b"):
        writer.publish(_view(name))
    first = _snap(reader).workers
    writer.publish(_view("b", free=100.0))
    writer.charge("c", 25.0)
    second = _snap(reader).workers
    assert [(w.name, w.gpu_free_mb, w.backlog_ms) for w in second] == [
        ("a", 500.0, 0.0), ("b", 100.0, 0.0), ("c", 500.0, 25.0)]
    assert second[0] is first[0]  # untouched: the same view, not rebuilt
    assert second[1] is not first[1] and second[2] is not first[2]
    assert second[1].resident is first[1].resident  # the same model set, shared


def test_counts_of_waiting_batch_inputs_are_read_and_go_with_their_worker(stores):
    from compass_celery.state.keys import forming_member, queued_member

    writer, reader, client = stores
    writer.publish(_view("a"))
    writer.publish(_view("b"))
    assert _snap(reader).workers[0].queued_inputs == {}
    writer.charge(forming_member("a", "t|m"), 3.0, table="forming")
    writer.charge(forming_member("b", "t|m"), 1.0, table="forming")
    writer.charge(queued_member("a", 5), 40.0, table="queued")
    a, b = _snap(reader).workers
    assert (a.queued_inputs, b.queued_inputs) == ({"t|m": 3}, {"t|m": 1})
    assert a.backlog_ms == 0.0  # a count is not work in ms
    writer.charge(forming_member("a", "t|m"), -3.0, table="forming")
    assert _snap(reader).workers[0].queued_inputs == {}
    writer.charge(forming_member("a", "t|m"), 2.0, table="forming")
    _snap(reader)
    # removing a worker drops its counts and its queued work per level, in Redis and in
    # every reader's mirror (read incrementally, from the change log)
    writer.remove("a")
    members = {m.decode() for m in client.hkeys(keys.key(keys.FORMING, "compass"))}
    assert members == {forming_member("b", "t|m")}
    assert client.hkeys(keys.key(keys.QUEUED, "compass")) == []
    snap = _snap(reader)
    assert [(w.name, w.queued_inputs) for w in snap.workers] == [("b", {"t|m": 1})]
    assert "a" not in reader._mirror.inputs and reader.full_reads == 1


def test_many_counter_changes_are_one_write_and_each_is_logged_once(private_redis_url):
    """``count`` applies a whole batch (a producer's flush, a worker's reconcile) in one
    script call: every change lands as one alone would (an addition adds, a reset never
    goes below zero, one that changes nothing logs nothing), other readers fetch them,
    and the writer's own reader skips each change it logged."""
    writer = RedisStateStore(private_redis_url, queue_prefix=QP)
    reader = RedisStateStore(private_redis_url, queue_prefix=QP)
    client = redis.Redis.from_url(private_redis_url)  # no one else's commands counted
    for name in ("a", "b"):
        writer.publish(_view(name))
    writer.count([("backlog", "c", 1.0, "add")])  # loads the script: one call from here
    _snap(reader)
    _snap(writer)
    calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    writer.count([("backlog", "a", 30.0, "add"), ("backlog", "b", 12.0, "add"),
                  ("queued", keys.queued_member("a", 9), 30.0, "add"),
                  ("backlog", "b", -20.0, "set")])
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == calls + 1
    snap = _snap(reader)
    assert (_backlog(snap, "a"), _backlog(snap, "b")) == (30.0, 0.0)
    assert next(w for w in snap.workers if w.name == "a").queued_ms == {9: 30.0}
    assert set(writer._mirror.own) == {"b:a", "b:b", f"q:{keys.queued_member('a', 9)}"}
    before = client.hget(keys.key(keys.STATE_LOG, "compass"), "version")
    writer.count([("backlog", "a", 30.0, "set")])  # the same value: nothing logged
    assert client.hget(keys.key(keys.STATE_LOG, "compass"), "version") == before
    mine = _snap(writer)  # the writer's own changes are not fetched back
    assert (_backlog(mine, "a"), _backlog(mine, "b")) == (30.0, 0.0)
    assert writer._mirror.own_skipped >= 3
