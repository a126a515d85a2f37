"""What a reader makes of the worker records it reads, through the production path
(:class:`RedisStateStore` -> :class:`StateMirror`): a record is decoded again only when
its bytes changed, forged and dead workers are skipped (and logged once), and a cached
record still dies when its beat lapses. The state Redis is a stand-in whose snapshot.lua
answers with a full read of what it holds (no Redis needed)."""

from __future__ import annotations

import logging
from typing import Any

from compass_celery.planner.types import WorkerView
from compass_celery.state.reader import SnapshotReader
from compass_celery.state.records import encode_record
from compass_celery.state.scripts import script
from compass_celery.state.store import RedisStateStore

QP = "compass.w."
NOW = 100.0  # this host's clock and the stand-in Redis's: one clock


class FakeStateRedis:
    """A stand-in state Redis: records and beats (Redis TIME of each worker's last one),
    read by a snapshot.lua that always answers with everything (a full read)."""

    def __init__(self) -> None:
        self.records: dict[bytes, bytes] = {}
        self.beats: dict[bytes, float] = {}

    def put(self, name: str, raw: bytes, age_s: float | None = 0.1) -> None:
        self.records[name.encode()] = raw
        if age_s is None:
            self.beats.pop(name.encode(), None)
        else:
            self.beats[name.encode()] = NOW - age_s

    def register_script(self, source: str) -> Any:
        def write(keys: Any = None, args: Any = None, client: Any = None) -> Any:
            raise AssertionError("a read writes nothing")

        if source != script("snapshot"):
            return write

        def read(keys: Any = None, args: Any = None, client: Any = None) -> list[Any]:
            timeout_s = float(args[2])
            flat = [x for item in self.records.items() for x in item]
            beats = [x for item in self.beats.items() for x in item]
            stale = [x for n, beat in self.beats.items() if beat < NOW - timeout_s
                     for x in (n, beat)]
            return [b"epoch", 1, str(NOW).encode(), b"full", len(self.records), stale,
                    [b"0", beats], [flat, [], [], [], [], [], [], []], []]
        return read


def _raw(name: str, free: float, queue: str | None = None) -> bytes:
    return encode_record(WorkerView(name=name, queue=queue or QP + name, gpu_total_mb=1000,
                                    gpu_free_mb=free, heartbeat=1.0)).encode()


def _store() -> tuple[RedisStateStore, FakeStateRedis]:
    redis = FakeStateRedis()
    return RedisStateStore("redis://unused", client_factory=lambda url: redis,
                           queue_prefix=QP), redis


def test_unchanged_records_are_reused_changed_ones_decoded_again():
    store, redis = _store()
    redis.put("a", _raw("a", 500))
    redis.put("b", _raw("b", 700))
    first = store.snapshot(NOW, 5.0)
    view_a = store._mirror.decoded["a"][1]
    redis.put("b", _raw("b", 100))
    second = store.snapshot(NOW, 5.0)
    assert store._mirror.decoded["a"][1] is view_a  # same bytes: not decoded again
    assert [w.gpu_free_mb for w in first.workers] == [500, 700]
    assert [w.gpu_free_mb for w in second.workers] == [500, 100]  # changed: fresh values
    assert all(w.heartbeat == NOW - 0.1 for w in second.workers)  # Redis-clock beat
    del redis.records[b"a"], redis.beats[b"a"]
    assert [w.name for w in store.snapshot(NOW, 5.0).workers] == ["b"]
    assert set(store._mirror.decoded) == {"b"}  # a removed worker is forgotten


def test_a_cached_record_still_dies_when_its_beat_lapses():
    store, redis = _store()
    redis.put("a", _raw("a", 500), age_s=1.0)
    assert len(store.snapshot(NOW, 5.0).workers) == 1
    redis.put("a", _raw("a", 500), age_s=6.0)
    snap = store.snapshot(NOW, 5.0)
    assert snap.workers == () and snap.skipped == ("worker 'a': heartbeat 6.0s old (dead)",)
    assert snap.dead == (("a", QP + "a"),)  # recovery drains its queue


def test_a_record_without_a_beat_is_dead():
    store, redis = _store()
    redis.put("a", _raw("a", 500), age_s=None)
    snap = store.snapshot(NOW, 5.0)
    assert snap.workers == () and snap.skipped == ("worker 'a': no heartbeat (dead)",)
    assert snap.dead == (("a", QP + "a"),)


def test_forged_and_garbled_records_are_skipped_never_judged_dead():
    store, redis = _store()
    redis.put("evil", _raw("evil", 500, queue="other-app"), age_s=60.0)  # lapsed, too
    redis.put("junk", b"{{")
    redis.put("a", _raw("a", 500))
    snap = store.snapshot(NOW, 5.0)
    assert [w.name for w in snap.workers] == ["a"]
    assert snap.skipped[0] == ("worker record 'evil' names queue 'other-app', not "
                               "'compass.w.evil' (forged or misconfigured): ignored, and "
                               "its queue is never drained")
    assert "'junk'" in snap.skipped[1] and "not valid JSON" in snap.skipped[1]
    assert snap.dead == ()  # a foreign queue is never drained
    refusal = store._mirror.decoded["evil"][1]
    store.snapshot(NOW, 5.0)
    assert store._mirror.decoded["evil"][1] is refusal  # same bytes: not judged again


def test_the_reader_logs_each_skipped_record_once(caplog):
    store, redis = _store()
    redis.put("evil", _raw("evil", 500, queue="other-app"))
    redis.put("old", _raw("old", 500), age_s=60.0)
    reader = SnapshotReader(store, ttl_s=0.0, heartbeat_timeout_s=5.0, clock=lambda: NOW)
    with caplog.at_level(logging.WARNING, logger="compass_celery.state"):
        reader.get()
        reader.invalidate()
        reader.get()
    logged = [r.getMessage() for r in caplog.records if r.name == "compass_celery.state"]
    assert logged == [
        "compass: skipping worker record 'evil' names queue 'other-app', not 'compass.w.evil' "
        "(forged or misconfigured): ignored, and its queue is never drained",
        "compass: skipping worker 'old': heartbeat 60.0s old (dead)"]
    assert reader.reads == 2
