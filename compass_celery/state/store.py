"""Cluster state: worker records, backlog counters and learned profiles.

Two stores share one interface: :class:`RedisStateStore` (the paper's
replicated state table; each process reads only what changed since its last read,
in one round trip, through the mirror in :mod:`compass_celery.state.mirror`) and
:class:`MemoryStateStore` (eager mode, unit tests, the simulator).
:class:`compass_celery.state.reader.SnapshotReader` adds the short local cache
producers use so a burst of enqueues does not hammer Redis.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..planner.types import WorkerView
from . import keys
from .cluster import unavailable_errors
from .connection import StateUnavailable, connect, text
from .mirror import CHANGE_LOG_SIZE, StateMirror, inputs_by_worker, queued_by_worker
from .mirror import epoch_candidate as epoch
from .records import (
    dead_reason,
    decode_ms,
    encode_record,
    judge_record,
    next_plan_error,
    next_profile,
    parse_plan_error,
    parse_profile,
)
from .scripts import register_script, run_pipeline
from .urls import masked

__all__ = ["MemoryStateStore", "RedisStateStore", "Snapshot", "StateStore"]

logger = logging.getLogger("compass_celery.state")

#: Per pipeline, the counter changes a store queued on it, as (reply index, change-log
#: members): :meth:`RedisStateStore.execute` hands their replies to the mirror. This
#: module's table, not the pipeline's attributes, and gone with the pipeline; the lock
#: guards it (stores are used from several threads).
_own_queued: weakref.WeakKeyDictionary[Any, list[tuple[int, list[str]]]] = \
    weakref.WeakKeyDictionary()

#: Per pipeline, the learned-value updates queued on it, as (reply index, update):
#: :meth:`RedisStateStore.execute` settles them (``_carry``). Guarded by the same lock.
_own_learned: weakref.WeakKeyDictionary[Any, list[tuple[int, Any]]] = \
    weakref.WeakKeyDictionary()
_own_lock = threading.Lock()
#: One counter change: (table of :data:`keys.COUNTERS`, member, ms, mode), mode "add" (add
#: ``ms``) or "set" (overwrite, never below zero).
CounterChange = tuple[str, str, float, str]
#: A load a producer planned: (worker, model, when it is to end: unix s).
PlannedLoad = tuple[str, str, float]
#: How long an entry of PLANNED_LOADS is kept past its end before a write trims it (s).
PLANNED_KEEP_S = 60.0
#: How many times one learned-value update is tried against other writers.
LEARN_TRIES = 5


@dataclass(frozen=True)
class Snapshot:
    """Live workers (backlog and pending folded in), learned run times, skipped records,
    and the (name, queue) of well-formed records whose beat lapsed: recovery's work."""

    workers: tuple[WorkerView, ...]
    profiles: Mapping[str, float] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    taken_at: float = 0.0
    dead: tuple[tuple[str, str], ...] = ()
    #: SLO class -> the learned plan error admission adds (ms).
    plan_errors: Mapping[str, float] = field(default_factory=dict)
    #: worker -> model -> when a load of it there, planned by a producer and not under way
    #: yet, is to end (unix s): every producer's, not over when read
    #: (``planner.fold.fold_planned`` folds them into the views a plan reads).
    planned_loads: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


class StateStore(Protocol):
    """What producers, workers and recovery need of the state; ``client`` is the raw
    Redis client (None for the in-process store)."""

    client: Any

    def publish(self, view: WorkerView, pipe: Any = None, **extra: Any) -> None:
        """Write a worker's record and beat; ``extra`` (informational counters) is kept
        beside the record, not in it, so counters never make readers re-fetch it."""

    def remove(self, name: str) -> None:
        """Forget a worker: its record, beat, backlog and pending counters."""

    def count(self, changes: Iterable[CounterChange], pipe: Any = None) -> None:
        """Apply counter changes together (a producer's flush of charges, a worker's
        reconcile): one write for them all; queued on ``pipe`` when given."""

    def charge(self, member: str, ms: float, pipe: Any = None, table: str = "backlog") -> None:
        """Add ``ms`` (negative to release) to a counter: by default a worker's backlog;
        ``table`` names another of :data:`keys.COUNTERS` ("queued", "forming"), whose
        ``member`` is built by :mod:`keys`. Reads never go below zero."""

    def set_backlog(self, member: str, ms: float, pipe: Any = None,
                    table: str = "backlog") -> None:
        """Overwrite a counter (by default a worker's backlog) with a reconciled value."""

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` of planned-but-unsent work to a worker; reads never go below zero."""

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        """Fold one measured run time into the learned one for ``task|model``."""

    def record_plan_error(self, slo: str, error_ms: float, tau: float, step: float,
                          pipe: Any = None) -> None:
        """Move SLO class ``slo``'s learned plan-error quantile ``tau`` one step towards
        ``error_ms``."""

    def plan_loads(self, loads: Iterable[PlannedLoad], pipe: Any = None) -> None:
        """Publish model loads a producer planned, (worker, model, when the load is to end:
        unix s), for every producer's next read; queued on ``pipe`` when given."""

    def count_refusal(self, slo: str, cause: str) -> None:
        """Count one refusal by admission of SLO class ``slo`` for ``cause``."""

    def refusals(self) -> dict[str, dict[str, int]]:
        """The refusals counted so far: SLO class -> cause -> count."""

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        """Every live worker (backlog and pending folded in) and the learned run times."""


def refusal_counts(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """REFUSALS' members and counts (bytes or str) as SLO class -> cause -> count; a
    field that is not a count is skipped."""
    out: dict[str, dict[str, int]] = {}
    for member, count in raw.items():
        slo, cause = keys.split_member(text(member))
        try:
            n = int(count)
        except (TypeError, ValueError):
            continue
        out.setdefault(slo, {})[cause] = n
    return out


class MemoryStateStore:
    """In-process store with the same behaviour as Redis (eager mode, tests, simulator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.client: Any = None
        self.records: dict[str, str] = {}
        # one dict per counter hash, as in Redis (keys.COUNTERS)
        self.counters: dict[str, dict[str, float]] = {t: {} for t in keys.COUNTERS}
        self.backlog = self.counters["backlog"]
        self.pending = self.counters["pending"]
        self.profiles: dict[str, str] = {}
        self.plan_errors: dict[str, str] = {}
        self.stats: dict[str, dict[str, Any]] = {}
        self.refused: dict[str, int] = {}  # refusal_member -> count (REFUSALS)
        self.planned: dict[tuple[str, str], float] = {}  # (worker, model) -> load's end

    def publish(self, view: WorkerView, pipe: Any = None, **extra: Any) -> None:
        """Write a worker's record, and ``extra`` (informational counters) beside it
        (``pipe`` is ignored)."""
        with self._lock:
            self.records[view.name] = encode_record(view)
            if extra:
                self.stats[view.name] = dict(extra)
            if view.backlog_ms:
                self.backlog.setdefault(view.name, view.backlog_ms)

    def remove(self, name: str) -> None:
        """Forget a worker: its record, backlog and pending counters."""
        with self._lock:
            for table in (self.records, self.backlog, self.pending, self.stats):
                table.pop(name, None)
            for table in (self.counters[t] for t in ("queued", "forming", "pending_queued")):
                for member in [m for m in table if keys.split_member(m)[0] == name]:
                    del table[member]

    def count(self, changes: Iterable[CounterChange], pipe: Any = None) -> None:
        """Apply counter changes, each never below zero (``pipe`` is ignored)."""
        with self._lock:
            for table, member, ms, mode in changes:
                counts = self.counters[table]
                base = counts.get(member, 0.0) if mode == "add" else 0.0
                counts[member] = max(0.0, base + ms)

    def charge(self, member: str, ms: float, pipe: Any = None, table: str = "backlog") -> None:
        """Add ``ms`` to a counter, never below zero (``pipe`` is ignored)."""
        self.count([(table, member, ms, "add")])

    def set_backlog(self, member: str, ms: float, pipe: Any = None,
                    table: str = "backlog") -> None:
        """Overwrite a counter with a reconciled value (``pipe`` is ignored)."""
        self.count([(table, member, ms, "set")])

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` of planned-but-unsent work, never below zero."""
        self.charge(worker, ms, table="pending")

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        """Fold one measured run time into the learned one for ``task|model``
        (records.next_profile, as the Redis store)."""
        with self._lock:
            self.profiles[key] = next_profile(self.profiles.get(key), ms, alpha)

    def record_plan_error(self, slo: str, error_ms: float, tau: float, step: float,
                          pipe: Any = None) -> None:
        """Move ``slo``'s learned plan error one step (records.next_plan_error)."""
        with self._lock:
            self.plan_errors[slo] = next_plan_error(self.plan_errors.get(slo), error_ms,
                                                    tau, step)

    def plan_loads(self, loads: Iterable[PlannedLoad], pipe: Any = None) -> None:
        """Publish planned loads (``pipe`` is ignored)."""
        with self._lock:
            for worker, model, ends in loads:
                self.planned[(worker, model)] = ends

    def count_refusal(self, slo: str, cause: str) -> None:
        """Count one refusal of SLO class ``slo`` for ``cause``."""
        with self._lock:
            member = keys.refusal_member(slo, cause)
            self.refused[member] = self.refused.get(member, 0) + 1

    def refusals(self) -> dict[str, dict[str, int]]:
        """The refusals counted so far: SLO class -> cause -> count."""
        with self._lock:
            return refusal_counts(self.refused)

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        """Every live worker, decoded from the in-process records (each record's own
        heartbeat decides liveness: every writer shares this process's clock)."""
        workers: list[WorkerView] = []
        skipped: list[str] = []
        dead: list[tuple[str, str]] = []
        with self._lock:
            queued = queued_by_worker(self.counters["queued"])
            levels = queued_by_worker(self.counters["pending_queued"])
            inputs = inputs_by_worker(self.counters["forming"])
            for name, raw in self.records.items():
                view = judge_record(name, raw, None)
                if isinstance(view, str):
                    skipped.append(view)
                elif now - view.heartbeat > heartbeat_timeout_s:
                    skipped.append(dead_reason(name, now - view.heartbeat))
                    dead.append((view.name, view.queue))
                else:
                    workers.append(replace(view, backlog_ms=decode_ms(self.backlog.get(name)),
                                           pending_ms=decode_ms(self.pending.get(name)),
                                           pending_queued_ms=levels.get(name, {}),
                                           queued_ms=queued.get(name, {}),
                                           queued_inputs=inputs.get(name, {})))
            profiles = {k: ms for k, ms in ((k, parse_profile(v))
                                            for k, v in self.profiles.items()) if ms is not None}
            errors = {k: ms for k, ms in ((k, parse_plan_error(v))
                                          for k, v in self.plan_errors.items()) if ms is not None}
            planned: dict[str, dict[str, float]] = {}
            for (worker, model), ends in self.planned.items():
                if ends >= now:
                    planned.setdefault(worker, {})[model] = ends
        workers.sort(key=lambda w: w.name)
        return Snapshot(tuple(workers), profiles, tuple(skipped), now, tuple(dead), errors,
                        planned)


#: How often a store reads everything again, whatever its change log says (a safety net).
FULL_READ_S = 60.0


class RedisStateStore:
    """Worker state in Redis. One client per process, rebuilt after fork.

    ``snapshot`` reads incrementally (see :mod:`compass_celery.state.mirror`).
    ``beat_sync_s`` bounds how old a live worker's reported heartbeat may be (liveness
    is exact on every read; a store that only routes, whose heartbeats nobody shows,
    passes ``full_read_s`` and takes them with the full reads, so its reads fetch
    nothing for workers that did not change); ``full_read_s`` is a safety net that reads
    everything again now and then, so a writer that logs nothing (an older compass during
    a rolling upgrade, a hand-made HSET) is seen within that time. ``full_reads`` and
    ``records_fetched`` count what this process's reads fetched.
    """

    def __init__(self, url: str, prefix: str = "compass",
                 client_factory: Callable[[str], Any] = connect,
                 queue_prefix: str | None = None, beat_sync_s: float = 5.0) -> None:
        self.url = url
        self.prefix = prefix
        self.queue_prefix = queue_prefix
        self.beat_sync_s = beat_sync_s
        self.full_read_s = FULL_READ_S
        self._factory = client_factory
        self._pid = -1
        self._client: Any = None
        self._keys = {k: keys.key(t, prefix) for k, t in (
            ("workers", keys.WORKERS), ("profiles", keys.PROFILES), ("beats", keys.BEATS),
            ("plan_errors", keys.PLAN_ERRORS), ("refusals", keys.REFUSALS),
            ("log", keys.STATE_LOG), ("changes", keys.CHANGES), ("stats", keys.WORKER_STATS),
            ("planned_loads", keys.PLANNED_LOADS),
            *((name, template) for name, (template, _) in keys.COUNTERS.items()))}
        self._log = [self._keys["log"], self._keys["changes"]]
        self._read_keys = [self._keys[k] for k in (
            "log", "changes", "workers", "beats", "backlog", "pending", "profiles", "queued",
            "forming", "plan_errors", "pending_queued", "planned_loads")]
        # (hash, field) -> the raw learned value this process last wrote or was told of:
        # what its next update starts from (learn.lua checks it is still current)
        self._learned: dict[tuple[str, str], str] = {}
        # (hash, field) -> a pipelined update another process's write made stale: (its
        # letter, its rule, the value found, the rule's result, tries so far), sent again
        # at the front of this process's next pipelined update (:meth:`_carry`)
        self._carried: dict[tuple[str, str], tuple[str, Callable[[Any], str], str | None,
                                                   str, int]] = {}
        self._fresh_mirror()

    def _fresh_mirror(self) -> None:
        self._lock = threading.Lock()
        self._mirror = StateMirror(self.queue_prefix)

    @property
    def client(self) -> Any:
        """This process's Redis client (a forked child builds its own)."""
        if self._client is None or self._pid != os.getpid():
            if self._pid != os.getpid() and self._pid != -1:
                self._fresh_mirror()  # a lock held across fork would never be released
            self._client = self._factory(self.url)
            self._pid = os.getpid()
            client = self._client
            self._counters = register_script(client, "changelog", "counters")
            self._learn = register_script(client, "changelog", "learn")
            self._publish = register_script(client, "changelog", "publish")
            self._remove = register_script(client, "changelog", "remove")
            self._read = register_script(client, "snapshot")
        return self._client

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except unavailable_errors() as exc:  # evaluated only when something was raised
            self._mirror.reset()  # reconnected or not, the next read starts over
            raise StateUnavailable(f"Redis at {masked(self.url)} unavailable: {exc}") from exc

    def publish(self, view: WorkerView, pipe: Any = None, **extra: Any) -> None:
        """Write a worker's record (logged only if it changed) and its beat; ``extra``
        (informational counters) goes to the worker-stats hash, which readers never fetch.
        Queued on ``pipe`` when given."""
        self._call(lambda: self.client)  # a cluster client connects when made
        stats = json.dumps(extra, separators=(",", ":")) if extra else ""
        self._call(lambda: self._publish(
            keys=[self._keys["workers"], self._keys["beats"], *self._log, self._keys["stats"]],
            args=[view.name, encode_record(view), epoch(), CHANGE_LOG_SIZE, stats],
            client=pipe))

    def remove(self, name: str) -> None:
        """Forget a worker (record, beat, its counters); readers drop it."""
        self._call(lambda: self.client)  # a cluster client connects when made
        self._call(lambda: self._remove(
            keys=[self._keys[k] for k in ("workers", "beats", "backlog", "pending")]
            + self._log + [self._keys[k] for k in ("stats", "queued", "forming",
                                                   "pending_queued")],
            args=[name, epoch(), CHANGE_LOG_SIZE, keys.MEMBER_SEP]))

    def count(self, changes: Iterable[CounterChange], pipe: Any = None) -> None:
        """Apply counter changes in one counters.lua call (each logged for readers if it
        changed the value); queued on ``pipe`` when given. This process's reads then skip
        the changes it logged (their values came back here)."""
        changes = list(changes)
        if not changes:
            return
        self._call(lambda: self.client)  # a cluster client connects when made
        tables = list(dict.fromkeys(table for table, _, _, _ in changes))
        at = {table: i + 3 for i, table in enumerate(tables)}  # KEYS index, from 1
        args: list[Any] = [epoch(), CHANGE_LOG_SIZE,
                           "".join(keys.COUNTERS[t][1] for t in tables)]
        for table, member, ms, mode in changes:
            args += (at[table], member, ms, mode)
        members = [f"{keys.COUNTERS[t][1]}:{m}" for t, m, _, _ in changes]
        reply = self._call(lambda: self._counters(
            keys=[*self._log, *(self._keys[t] for t in tables)], args=args, client=pipe))
        if pipe is None:
            self._note_own(members, reply)
        else:  # its reply comes from execute(pipe): remember where it will be
            with _own_lock:
                _own_queued.setdefault(pipe, []).append((len(pipe) - 1, members))

    def _note_own(self, members: list[str], reply: Any) -> None:
        """Hand counters.lua's reply (epoch, then value and version a change) to the
        mirror, change by change."""
        if not isinstance(reply, (list, tuple)) or len(reply) != 1 + 2 * len(members):
            return  # not counters.lua's (a stand-in client): nothing to skip
        for k, member in enumerate(members):
            self._mirror.note_own(member, (reply[2 * k + 1], reply[2 * k + 2], reply[0]))

    def charge(self, member: str, ms: float, pipe: Any = None, table: str = "backlog") -> None:
        """Add ``ms`` to a counter (by default a worker's backlog); queued on ``pipe``
        when given."""
        self.count([(table, member, ms, "add")], pipe)

    def set_backlog(self, member: str, ms: float, pipe: Any = None,
                    table: str = "backlog") -> None:
        """Overwrite a counter (by default a worker's backlog) with a reconciled value
        (never below zero); queued on ``pipe`` when given."""
        self.count([(table, member, ms, "set")], pipe)

    def add_pending(self, worker: str, ms: float, pipe: Any = None) -> None:
        """Add ``ms`` of planned-but-unsent work; queued on ``pipe`` when given."""
        self.count([("pending", worker, ms, "add")], pipe)

    def record_run(self, key: str, ms: float, alpha: float, pipe: Any = None) -> None:
        """Fold a measured run time into the learned one (records.next_profile) and log it
        for readers; queued on ``pipe`` when given (one round trip either way)."""
        self._update("profiles", "f", key, lambda raw: next_profile(raw, ms, alpha), pipe)

    def record_plan_error(self, slo: str, error_ms: float, tau: float, step: float,
                          pipe: Any = None) -> None:
        """Move ``slo``'s learned plan error one step (records.next_plan_error) and log it
        for readers; queued on ``pipe`` when given."""
        self._update("plan_errors", "e", slo,
                     lambda raw: next_plan_error(raw, error_ms, tau, step), pipe)

    def plan_loads(self, loads: Iterable[PlannedLoad], pipe: Any = None) -> None:
        """Publish planned loads (one ZADD; entries over for a minute are trimmed in the
        same step, so the set holds about the loads under way); queued on ``pipe`` when
        given."""
        scores = {keys.loads_member(worker, model): ends for worker, model, ends in loads}
        if not scores:
            return
        key = self._keys["planned_loads"]

        def queue(p: Any) -> None:
            p.zadd(key, scores)
            p.zremrangebyscore(key, "-inf", time.time() - PLANNED_KEEP_S)
        if pipe is not None:
            queue(pipe)
            return

        def send() -> Any:
            with self.client.pipeline(transaction=False) as p:
                queue(p)
                return p.execute()
        self._call(send)

    def count_refusal(self, slo: str, cause: str) -> None:
        """Count one refusal of SLO class ``slo`` for ``cause`` (one HINCRBY)."""
        self._call(lambda: self.client.hincrby(self._keys["refusals"],
                                               keys.refusal_member(slo, cause), 1))

    def refusals(self) -> dict[str, dict[str, int]]:
        """The refusals counted so far: SLO class -> cause -> count."""
        return refusal_counts(self._call(lambda: self.client.hgetall(self._keys["refusals"])))

    def _update(self, table: str, letter: str, field: str, rule: Callable[[Any], str],
                pipe: Any) -> None:
        """Apply ``rule`` (old raw value, None for none -> new) to one learned value.

        The rule is Python's alone; learn.lua only writes its result if the field still
        holds what it was computed from (compare-and-set), atomically with the change
        log. The field is usually what this process wrote last, so a write takes one
        round trip, queued with the caller's; when another process wrote meanwhile (or
        this one never read it), the script returns the current value and the rule is
        applied again to it (:meth:`_settle`; on a pipeline, :meth:`_carry`, which sends
        it with the next pipelined update instead of waiting for another round trip). A
        WATCH/MULTI transaction could not join the caller's pipeline and would abort on
        any other field of the same hash."""
        self._call(lambda: self.client)  # a cluster client connects when made
        if pipe is not None and self._carried:
            self._send_carried(pipe)
        start = self._learned.get((table, field))
        new = rule(start)
        call = (table, letter, field, rule, new)
        reply = self._call(lambda: self._learn(
            keys=[self._keys[table], *self._log],
            args=[field, start or "", new, f"{letter}:{field}", epoch(), CHANGE_LOG_SIZE],
            client=pipe))
        if pipe is None:
            self._settle(call, reply)
        else:  # its reply comes from execute(pipe)
            with _own_lock:
                _own_learned.setdefault(pipe, []).append((len(pipe) - 1, call))

    def _settle(self, call: tuple[str, str, str, Callable[[Any], str], str],
                reply: Any) -> None:
        """Finish an update from learn.lua's reply: remember what was written, or apply
        the rule again to the value found, until it is written (at most ``LEARN_TRIES``;
        past that the observation is dropped, as a lost best-effort write is)."""
        table, letter, field, rule, new = call
        for _ in range(LEARN_TRIES):
            if int(reply[0]) == 1:
                self._learned[(table, field)] = new
                return
            found = None if reply[1] is None else text(reply[1])
            new = rule(found)
            reply = self._call(lambda f=found, n=new: self._learn(
                keys=[self._keys[table], *self._log],
                args=[field, f or "", n, f"{letter}:{field}", epoch(), CHANGE_LOG_SIZE]))
        logger.debug("compass: %s %r not learned: written by others %d times meanwhile",
                     table, field, LEARN_TRIES)

    def execute(self, pipe: Any) -> list[Any]:
        """Run what was queued on ``pipe`` (one round trip) and return its replies; this
        process's reads then skip the counter changes it made (their values came back
        here)."""
        replies = self._call(lambda: run_pipeline(pipe))
        with _own_lock:
            own = _own_queued.pop(pipe, ())
            learned = _own_learned.pop(pipe, ())
        for at, members in own:
            self._note_own(members, replies[at])
        for at, call in learned:
            self._carry(call, replies[at])
        return replies

    def _carry(self, call: tuple[Any, ...], reply: Any) -> None:
        """Finish a pipelined update from learn.lua's reply without another round trip:
        remember what was written, or, when another process wrote the field meanwhile
        (each worker learning the same model's run time: 0.65 a task on the Compass
        authors' workflows, each a round trip between a busy worker's tasks), apply the
        rule to the value found and carry the write to the front of this process's next
        pipelined update (after :data:`LEARN_TRIES` such tries it is dropped, as a lost
        best-effort write is). Updates of one field carried together are applied in
        order: the later rule on the earlier one's result."""
        table, letter, field, rule, new = call[:5]
        tries = call[5] if len(call) > 5 else 1
        key = (table, field)
        if int(reply[0]) == 1:
            self._learned[key] = new
            return
        found = None if reply[1] is None else text(reply[1])
        earlier = self._carried.get(key)
        if earlier is not None:  # this pipeline's earlier update of it, found stale too
            first = earlier[1]
            rule = (lambda raw, a=first, b=rule: b(a(raw)))  # noqa: E731
            tries = max(tries, earlier[4])
        if tries >= LEARN_TRIES:
            self._carried.pop(key, None)
            logger.debug("compass: %s %r not learned: written by others %d times "
                         "meanwhile", table, field, tries)
            return
        new = rule(found)
        self._carried[key] = (letter, rule, found, new, tries + 1)
        self._learned[key] = new  # the next update starts from it, written just before

    def _send_carried(self, pipe: Any) -> None:
        """Queue the carried updates (:meth:`_carry`) on ``pipe``, settled by execute."""
        carried, self._carried = self._carried, {}
        for (table, name), (letter, rule, found, new, tries) in carried.items():
            self._learn(keys=[self._keys[table], *self._log],
                        args=[name, found or "", new, f"{letter}:{name}", epoch(),
                              CHANGE_LOG_SIZE], client=pipe)
            with _own_lock:
                _own_learned.setdefault(pipe, []).append(
                    (len(pipe) - 1, (table, letter, name, rule, new, tries)))

    def snapshot(self, now: float, heartbeat_timeout_s: float) -> Snapshot:
        """Every live worker, from what changed since this process's last read."""
        self._call(lambda: self.client)  # a cluster client connects when made
        with self._lock:
            parts = self._call(lambda: self._mirror.read(
                lambda args: self._read(keys=self._read_keys, args=args),
                heartbeat_timeout_s, now, self.beat_sync_s, self.full_read_s))
            planned = self._mirror.planned
        return Snapshot(parts[0], parts[1], parts[2], now, parts[3], parts[4], planned)

    @property
    def full_reads(self) -> int:
        """How many of this process's reads fetched everything."""
        return self._mirror.full_reads

    @property
    def records_fetched(self) -> int:
        """Worker records this process's reads fetched from Redis, full reads included."""
        return self._mirror.records_fetched
