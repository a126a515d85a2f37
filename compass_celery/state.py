"""Cluster state: worker records, backlog counters and learned profiles.

Two stores share one interface: :class:`RedisStateStore` (the paper's
replicated state table, one pipelined round trip per snapshot) and
:class:`MemoryStateStore` (eager mode, unit tests, the simulator).
:class:`SnapshotReader` adds the short local cache producers use so a burst of
enqueues does not hammer Redis.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import keys
from .planner.types import WorkerView
from .records import RecordError, decode_ms, decode_record, encode_record
from .scripts import script

logger = logging.getLogger("compass_celery.state")


class StateUnavailable(RuntimeError):
    """The state store cannot be reached; producers fall back to the shared queue."""


@dataclass(frozen=True)
class Snapshot:
    """Live workers (backlog and pending folded in), learned run times, skipped records,
    and the (name, queue) of well-formed records whose beat lapsed: recovery's work."""

    workers: tuple[WorkerView, ...]
    profiles: Mapping[str, float] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    taken_at: float = 0.0
    dead: tuple[tuple[str, str], ...] = ()


class StateStore(Protocol):
    """What producers, workers and recovery need of the state; ``client`` is the raw
    Redis client (None for the in-process store)."""

    client: Any

    def publish(self, view: WorkerView, **extra: Any) -> None:
        """Write a worker's record and beat (``extra`` adds informational fields)."""

    def remove(self, name: str) -> None:
        """Forget a worker: its record, beat, backlog and pending counters."""

    def charge(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` (negative to release) to a worker's backlog, never below zero."""

    def set_backlog(self, worker: str, ms: float) -> None:
        """Overwrite a worker's backlog with a reconciled value."""

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` of planned-but-unsent work to a worker, never below zero."""

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        """Fold one measured run time into the learned one for ``task|model``."""

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        """Every live worker (backlog and pending folded in) and the learned run times."""


def text(value: Any) -> str:
    """A Redis reply as text (the client returns bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _str_keys(table: Mapping[Any, Any]) -> dict[str, Any]:
    return {text(k): v for k, v in table.items()}


def _assemble(records: Mapping[str, bytes | str], backlog: Mapping[Any, Any],
              pending: Mapping[Any, Any], profiles_raw: Mapping[Any, Any], now: float,
              timeout_s: float, ages: Mapping[str, float] | None = None,
              queue_prefix: str | None = None,
              decoded: dict[str, tuple[Any, WorkerView]] | None = None) -> Snapshot:
    """Decode the records of live workers.

    ``ages`` (seconds since each worker's last beat, on Redis's clock) decides
    liveness when given; a heartbeat's host time is then informational only and
    is replaced by ``now - age``, so two hosts' clocks are never compared. A record
    whose queue is not ``queue_prefix + name`` is refused: it would send work, or
    recovery, to somebody else's queue. ``decoded`` keeps the last decoded view per
    worker with its raw record, so an unchanged record is not decoded again.
    """
    records, backlog, pending, profiles_raw = (
        _str_keys(records), _str_keys(backlog), _str_keys(pending), _str_keys(profiles_raw))
    workers: list[WorkerView] = []
    skipped: list[str] = []
    dead: list[tuple[str, str]] = []
    seen = decoded if decoded is not None else {}
    for name, raw in records.items():
        hit = seen.get(name)
        if hit is not None and hit[0] == raw:
            view = hit[1]
        else:
            try:
                view = decode_record(raw, field_name=name)
            except RecordError as exc:
                skipped.append(str(exc))
                continue
            seen[name] = (raw, view)
        if queue_prefix is not None and view.queue != queue_prefix + view.name:
            skipped.append(f"worker record {name!r} names queue {view.queue!r}, not "
                           f"{queue_prefix + view.name!r} (forged or misconfigured): ignored, "
                           "and its queue is never drained")
            continue
        if ages is not None:
            age = ages.get(name)
            if age is None:
                skipped.append(f"worker {name!r}: no heartbeat (dead)")
                dead.append((view.name, view.queue))
                continue
            beat = now - age
        else:
            beat = view.heartbeat
        if now - beat > timeout_s:
            skipped.append(f"worker {name!r}: heartbeat {now - beat:.1f}s old (dead)")
            dead.append((view.name, view.queue))
            continue
        workers.append(replace(view, heartbeat=beat, backlog_ms=decode_ms(backlog.get(name)),
                               pending_ms=decode_ms(pending.get(name))))
    if decoded is not None:
        for gone in set(decoded) - set(records):
            decoded.pop(gone, None)
    profiles: dict[str, float] = {}
    for key, raw in profiles_raw.items():
        try:
            ms = float(json.loads(raw)["exec_ms"])
        except (ValueError, KeyError, TypeError):
            continue
        if math.isfinite(ms) and ms >= 0:
            profiles[key] = ms
    workers.sort(key=lambda w: w.name)
    return Snapshot(tuple(workers), profiles, tuple(skipped), now, tuple(dead))


class MemoryStateStore:
    """In-process store with the same behaviour as Redis (eager mode, tests, simulator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.client: Any = None
        self.records: dict[str, str] = {}
        self.backlog: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.profiles: dict[str, str] = {}

    def publish(self, view: WorkerView, **extra: Any) -> None:
        with self._lock:
            self.records[view.name] = encode_record(view, **extra)
            if view.backlog_ms:
                self.backlog.setdefault(view.name, view.backlog_ms)

    def remove(self, name: str) -> None:
        with self._lock:
            for table in (self.records, self.backlog, self.pending):
                table.pop(name, None)

    def charge(self, worker: str, ms: float, pipe: Any = None) -> None:
        with self._lock:
            self.backlog[worker] = max(0.0, self.backlog.get(worker, 0.0) + ms)

    def set_backlog(self, worker: str, ms: float) -> None:
        with self._lock:
            self.backlog[worker] = max(0.0, ms)

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        with self._lock:
            self.pending[worker] = max(0.0, self.pending.get(worker, 0.0) + ms)

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        with self._lock:
            old = self.profiles.get(key)
            prof = json.loads(old) if old else None
            if prof and ms <= prof["exec_ms"] * 3 and ms * 3 >= prof["exec_ms"]:
                ms = prof["exec_ms"] + alpha * (ms - prof["exec_ms"])
            self.profiles[key] = json.dumps({"exec_ms": ms, "n": (prof or {"n": 0})["n"] + 1})

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        with self._lock:
            return _assemble(dict(self.records), dict(self.backlog), dict(self.pending),
                             dict(self.profiles), now, heartbeat_timeout_s)


def connect(url: str, *, master_name: str | None = None,
            sentinel_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """A redis client for ``url``: redis://, rediss:// (TLS), unix://, or Celery's
    ``sentinel://[user:password@]host:port;sentinel://host2:port`` form (the master
    named ``master_name``; ``sentinel_kwargs`` authenticate to the sentinels
    themselves, e.g. ``{"password": ..., "ssl": True}``, as in Celery's
    ``broker_transport_options``).

    Short socket timeouts keep an enqueue from hanging when Redis is away: the
    router then falls back to the shared queue instead.
    """
    import redis

    opts: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0,
                            "health_check_interval": 10}
    opts.update(kwargs)
    if url.startswith("sentinel://"):
        return _sentinel_master(url, master_name, opts, sentinel_kwargs or {})
    return redis.Redis.from_url(url, **opts)


def _sentinel_master(url: str, master_name: str | None, opts: dict[str, Any],
                     sentinel_kwargs: dict[str, Any]) -> Any:
    from urllib.parse import unquote, urlparse

    from redis.sentinel import Sentinel

    if not master_name:
        raise StateUnavailable(
            f"state URL {url!r} is a Sentinel URL but names no master: set "
            "compass_sentinel_master (or broker_transport_options['master_name'])")
    hosts, username, password, db = [], None, None, 0
    for part in url.split(";"):
        u = urlparse(part.strip())
        hosts.append((u.hostname or "127.0.0.1", u.port or 26379))
        username = username or (unquote(u.username) if u.username else None)
        password = password or (unquote(u.password) if u.password else None)
        if u.path.strip("/").isdigit():
            db = int(u.path.strip("/"))
    timeouts = {k: opts[k] for k in ("socket_connect_timeout", "socket_timeout")}
    sentinel = Sentinel(hosts, sentinel_kwargs={**timeouts, **sentinel_kwargs}, **timeouts)
    return sentinel.master_for(master_name, db=db, username=username, password=password,
                               **opts)


class RedisStateStore:
    """Worker state in Redis. One client per process, rebuilt after fork."""

    def __init__(self, url: str, prefix: str = "compass",
                 client_factory: Callable[[str], Any] = connect,
                 queue_prefix: str | None = None) -> None:
        self.url = url
        self.prefix = prefix
        self.queue_prefix = queue_prefix
        self._decoded: dict[str, tuple[Any, WorkerView]] = {}  # per process, see _assemble
        self._factory = client_factory
        self._pid = -1
        self._client: Any = None
        self._keys = {k: keys.key(t, prefix) for k, t in (
            ("workers", keys.WORKERS), ("backlog", keys.BACKLOG), ("pending", keys.PENDING),
            ("profiles", keys.PROFILES), ("beats", keys.BEATS))}

    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = self._factory(self.url)
            self._pid = os.getpid()
            self._charge = self._client.register_script(script("charge"))
            self._ewma = self._client.register_script(script("ewma"))
            self._publish = self._client.register_script(script("publish"))
        return self._client

    def _call(self, fn: Callable[[], Any]) -> Any:
        import redis

        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise StateUnavailable(f"Redis at {self.url} unavailable: {exc}") from exc

    def publish(self, view: WorkerView, **extra: Any) -> None:
        _ = self.client
        self._call(lambda: self._publish(keys=[self._keys["workers"], self._keys["beats"]],
                                         args=[view.name, encode_record(view, **extra)]))

    def remove(self, name: str) -> None:
        def go() -> None:
            pipe = self.client.pipeline()
            for key in ("workers", "backlog", "pending"):
                pipe.hdel(self._keys[key], name)
            pipe.zrem(self._keys["beats"], name)
            pipe.execute()
        self._call(go)

    def charge(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` to a worker's backlog; queued on ``pipe`` when given."""
        _ = self.client
        self._call(lambda: self._charge(keys=[self._keys["backlog"]], args=[worker, ms],
                                        client=pipe))

    def set_backlog(self, worker: str, ms: float) -> None:
        self._call(lambda: self.client.hset(self._keys["backlog"], worker, max(0.0, ms)))

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` of planned-but-unsent work; queued on ``pipe`` when given."""
        _ = self.client
        self._call(lambda: self._charge(keys=[self._keys["pending"]], args=[worker, ms],
                                        client=pipe))

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        """Fold a measured run time into the learned one; queued on ``pipe`` when given."""
        _ = self.client
        self._call(lambda: self._ewma(keys=[self._keys["profiles"]], args=[key, ms, alpha],
                                      client=pipe))

    def execute(self, pipe: Any) -> None:
        """Run what was queued on ``pipe`` (one round trip)."""
        self._call(pipe.execute)

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        def go() -> Snapshot:
            pipe = self.client.pipeline(transaction=False)
            for key in ("workers", "backlog", "pending", "profiles"):
                pipe.hgetall(self._keys[key])
            pipe.zrange(self._keys["beats"], 0, -1, withscores=True)
            pipe.time()
            records, backlog, pending, profiles, beats, (sec, usec) = pipe.execute()
            redis_now = sec + usec / 1e6
            ages = {text(n): max(0.0, redis_now - score) for n, score in beats}
            return _assemble(records, backlog, pending, profiles, now, heartbeat_timeout_s,
                             ages, self.queue_prefix, self._decoded)
        return self._call(go)


class SnapshotReader:
    """Reuses a snapshot for ``ttl_s`` and applies this process's own charges to it.

    Without the local charges, every task in a burst would see the same stale
    backlog and pile onto one worker until the cache expired.
    """

    def __init__(self, store: StateStore, ttl_s: float, heartbeat_timeout_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.ttl_s, self.clock = store, ttl_s, clock
        self.timeout_s = heartbeat_timeout_s
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._reported: set[str] = set()
        self.reads = 0
        # After a failed read, fail fast for this long instead of paying a connect
        # timeout on every enqueue while Redis is away.
        self.retry_after_s = 1.0
        self._down_until, self._down_why = 0.0, ""

    def get(self) -> Snapshot:
        now = self.clock()
        with self._lock:
            if self._snap is not None and now - self._snap.taken_at <= self.ttl_s:
                return self._snap
            if now < self._down_until:  # failed moments ago: fail fast, don't wait again
                raise StateUnavailable(self._down_why)
        try:
            snap = self.store.snapshot(now, self.timeout_s)
        except StateUnavailable as exc:
            with self._lock:
                self._down_until, self._down_why = now + self.retry_after_s, str(exc)
            raise
        self.reads += 1
        for why in snap.skipped:
            if why not in self._reported:
                self._reported.add(why)
                logger.warning("compass: skipping %s", why)
        with self._lock:
            self._snap = snap
        return snap

    def note_charge(self, worker: str, ms: float) -> None:
        with self._lock:
            if self._snap is None:
                return
            self._snap = replace(self._snap, workers=tuple(
                replace(w, backlog_ms=max(0.0, w.backlog_ms + ms)) if w.name == worker else w
                for w in self._snap.workers))

    def invalidate(self) -> None:
        with self._lock:
            self._snap = None
