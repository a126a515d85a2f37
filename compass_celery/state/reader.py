"""The snapshot cache producers read through: one store read per ``ttl_s``.

A burst of enqueues in one process plans against one snapshot, and the process's own
backlog charges are folded into it as they are made, so the burst spreads over the
workers instead of piling onto the one that looked idle when the snapshot was taken.

A busy process does not wait for reads at all: once its snapshot is older than ``ttl_s``
(but younger than ``ttl_s + refresh_ahead_s``), a decision plans on it while a thread of
the reader's own reads the store and swaps the new snapshot in. Only a process that has
been idle longer than that reads before it decides. Either way a decision sees state at
most ``ttl_s + refresh_ahead_s`` old.
A decision may ask for younger state (``get``'s ``max_age_s``: a job with a deadline reads
the store at its submission) and then waits for the read.

A process in use keeps its snapshot fresh: for ``keep_fresh_s`` after a decision, the
reader's thread reads again before the snapshot gets too old to use (halfway through the
read-ahead window), so a web process deciding now and then (between requests) finds state
no older than a busy one does and never waits for Redis. Past that it stops reading, and
its next decision reads first. The thread also hands each snapshot it read to ``prepare``
(the router builds its cluster view there), so the work a new snapshot costs a decision is
done before the decision comes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from ..planner.cost import evolve
from ..planner.fold import Rank, planned_load
from ..planner.fold import charged as _charge
from ..planner.types import WorkerView
from .connection import StateUnavailable
from .keys import LOADS, split_member
from .store import Snapshot, StateStore

logger = logging.getLogger("compass_celery.state")


class SnapshotReader:
    """Reuses a snapshot for ``ttl_s`` and applies this process's own charges to it.

    Without the local charges, every task in a burst would see the same stale
    backlog and pile onto one worker until the cache expired. ``charges`` (the router's
    :class:`~compass_celery.state.charges.ChargeBatcher`) writes no charge while a store read
    runs, and every charge it has not written yet (made before the read or during it) is
    folded into what was read: each charge counts exactly once, also while a read runs
    ahead, and a read waits for no write.
    ``reads`` counts store reads; ``background_reads`` those made ahead, off the
    decision path; ``waits`` the gets that waited for a read, their own or (when this
    process got no core for a while) the one the reader's thread had under way.
    """

    def __init__(self, store: StateStore, ttl_s: float, heartbeat_timeout_s: float,
                 clock: Callable[[], float] = time.time, refresh_ahead_s: float = 0.0,
                 keep_fresh_s: float = 0.0) -> None:
        self.store, self.ttl_s, self.clock = store, ttl_s, clock
        self.timeout_s = heartbeat_timeout_s
        self.refresh_ahead_s = refresh_ahead_s
        self.keep_fresh_s = keep_fresh_s
        self.prepare: Callable[[Snapshot], object] | None = None
        #: What a read is folded through before it is kept: every producer's planned
        #: loads into the workers' views (``state.views.with_planned_loads``); None: kept
        #: as read.
        self.fold: Callable[[Snapshot], Snapshot] | None = None
        self._used_at = float("-inf")  # clock time of the last get
        self._dormant = True  # the thread waits for a get (not keeping fresh)
        self.charges: ChargeSource | None = None
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._index: dict[str, int] = {}
        self._indexed: tuple[WorkerView, ...] | None = None
        self._reported: set[str] = set()
        self.reads = self.background_reads = 0
        self.waits = 0  # gets that waited for a read (their own or the thread's)
        self.retry_after_s = 1.0  # after a failed read, fail fast this long (Redis is away)
        self._down_until, self._down_why = 0.0, ""
        self._wake = threading.Event()
        self._refreshing = False
        self._read_done = threading.Condition(self._lock)
        self._thread_pid: int | None = None

    def get(self, refresh_ahead_s: float | None = None,
            max_age_s: float | None = None) -> Snapshot:
        """The cached snapshot while younger than ``ttl_s``; past that, still the cached one
        while a fresh one is read ahead (within ``refresh_ahead_s``, this reader's unless
        given), else a fresh one. ``max_age_s``: a cached snapshot older than this is not
        used at all, the store is read now (a decision that must not plan on a worker's
        past: :func:`compass_celery.jobs.send.state_max_age_s`)."""
        now = self.clock()
        ahead_s = self.refresh_ahead_s if refresh_ahead_s is None else refresh_ahead_s
        with self._lock:
            self._used_at = now
            snap = self._snap
            fresh = max_age_s is not None  # read now unless young enough for this decision
            if fresh and snap is not None and now - snap.taken_at > max_age_s:
                snap = None
            if snap is not None:
                age = now - snap.taken_at
                if age <= self.ttl_s:
                    if self._dormant and self.keep_fresh_s > 0:
                        self._keep_fresh()
                    return snap
                if age <= self.ttl_s + ahead_s:
                    if now >= self._down_until:  # (a read that failed is not retried yet)
                        self._read_ahead()
                    return snap
            if now < self._down_until:  # failed moments ago: fail fast, don't wait again
                raise StateUnavailable(self._down_why)
            self.waits += 1
            if self._refreshing and self._thread_pid == os.getpid() and not fresh:
                # the reader's thread is reading (this process got no core for a while):
                # take what it reads rather than reading the same changes again
                self._read_done.wait(self.retry_after_s)
                snap = self._snap  # (its read began before this call: judged as of then)
                if snap is not None and now - snap.taken_at <= self.ttl_s + ahead_s:
                    return snap
                now = self.clock()
            if now < self._down_until:  # failed moments ago: fail fast, don't wait again
                raise StateUnavailable(self._down_why)
        return self._read(now)

    def _read(self, now: float) -> Snapshot:
        """Read the store now (in the caller's thread) and keep the result."""
        try:
            if self.charges is None:
                snap = self.store.snapshot(now, self.timeout_s)
            else:
                snap, unflushed = self.charges.read_through(
                    lambda: self.store.snapshot(now, self.timeout_s))
                snap = _planning(_charged(snap, unflushed), unflushed)
            if self.fold is not None and snap.planned_loads:
                snap = self.fold(snap)
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
            if self._snap is None or snap.taken_at >= self._snap.taken_at:
                self._snap = snap
            if self.keep_fresh_s > 0:
                self._keep_fresh()
        return snap

    def _start_thread(self) -> None:
        """Start the reader's thread unless this process has it (called with the lock held)."""
        pid = os.getpid()
        if self._thread_pid != pid:  # first use, or a forked child: a thread of its own
            self._thread_pid, self._refreshing = pid, False
            threading.Thread(target=self._run, name="compass-snapshot", daemon=True).start()

    def _keep_fresh(self) -> None:
        """Have the reader's thread plan its next read from the current snapshot (called
        with the lock held)."""
        self._start_thread()
        self._dormant = False
        self._wake.set()

    def _read_ahead(self) -> None:
        """Have the reader's thread read the store (called with the lock held)."""
        self._start_thread()
        if not self._refreshing:
            self._refreshing = True
            self._wake.set()

    def _next_read_in(self, now: float) -> float | None:
        """Seconds until the thread should read (0: now), or None to wait for a get
        (called with the lock held)."""
        if self._refreshing:
            return 0.0
        snap = self._snap
        if self.keep_fresh_s <= 0 or self.ttl_s <= 0 or snap is None \
                or now - self._used_at > self.keep_fresh_s:  # (TTL 0: every get reads)
            self._dormant = True
            return None
        self._dormant = False
        # halfway through the read-ahead window (3/4 of the TTL without one): a busy
        # process's own decisions have read ahead by then, and an idle one's snapshot is
        # replaced before a decision would have to wait for a read
        lead = self.ttl_s + self.refresh_ahead_s / 2 if self.refresh_ahead_s > 0 \
            else self.ttl_s * 0.75
        due = max(snap.taken_at + lead, self._down_until)
        if due <= now:
            self._refreshing = True
            return 0.0
        return due - now

    def _run(self) -> None:
        pid = os.getpid()
        while self._thread_pid == pid:
            with self._lock:
                wait = self._next_read_in(self.clock())
            if wait != 0.0:
                self._wake.wait(wait)
                self._wake.clear()
                continue
            try:
                snap = self._read(self.clock())
                self.background_reads += 1
                if self.prepare is not None:
                    self.prepare(snap)
            except StateUnavailable:
                pass  # remembered by _read: decisions past the grace fail fast, then retry
            except Exception:  # the thread must outlive anything one read meets
                logger.exception("compass: reading the cluster state ahead failed")
            finally:
                with self._lock:
                    self._refreshing = False
                    self._read_done.notify_all()

    def note_charge(self, worker: str, ms: float, pending: bool = False,
                    level: int | None = None, batch: str = "") -> None:
        """Add ``ms`` to ``worker``'s backlog (``pending``: its planned-but-unsent work; with
        ``level``, queued work of that priority too; with ``batch``, one input more (ms
        > 0) or less waiting under that batch key) in this process's snapshot only."""
        def change(w: WorkerView) -> WorkerView:
            w = _charge(w, ms, pending, level)
            return _count_input(w, batch, 1 if ms > 0 else -1) if batch else w
        self._fold(worker, change)

    def note_load(self, worker: str, model: str, span: tuple[float, float],
                  sizes: Mapping[str, float], rank: Rank | Callable[[], Rank] | None = None
                  ) -> bool:
        """Fold a load of ``model`` this process planned on ``worker`` into its snapshot
        (``planner.fold.planned_load``: loading over ``span`` on the reader's clock, what
        the cache would evict for it gone), until the next read replaces the row; whether
        it changed the row (False: the model is resident or loading there already, or no
        snapshot holds the worker)."""
        return self._fold(worker, lambda w: planned_load(w, model, sizes, *span, rank))

    def _fold(self, worker: str, change: Callable[[WorkerView], WorkerView]) -> bool:
        """Replace ``worker``'s view in this process's snapshot with ``change`` of it;
        whether that changed it."""
        with self._lock:
            snap = self._snap
            if snap is None:
                return False
            workers = snap.workers
            if self._indexed is not workers:  # positions by name, kept while they hold
                self._index = {w.name: i for i, w in enumerate(workers)}
            i = self._index.get(worker)
            if i is None:
                return False
            w = change(workers[i])
            if w is workers[i]:
                return False
            workers = (*workers[:i], w, *workers[i + 1:])
            self._indexed = workers
            self._snap = evolve(snap, workers=workers)
            return True

    def read_before_deciding(self) -> None:
        """From now on read at each decision past the TTL: no reading ahead, no keeping
        fresh, no view built in the reader's thread (a worker's re-placements)."""
        self.refresh_ahead_s = self.keep_fresh_s = 0.0
        self.prepare = None

    def close(self) -> None:
        """Stop the reader's thread (a later ``get`` reads, and starts it again)."""
        with self._lock:
            self._thread_pid = None
        self._wake.set()

    def invalidate(self) -> None:
        """Drop the cached snapshot: the next ``get`` reads the store."""
        with self._lock:
            self._snap = None


class ChargeSource(Protocol):
    """What the reader needs of the router's charge batcher."""

    def read_through(self, read: Callable[[], Snapshot]
                     ) -> tuple[Snapshot, dict[tuple[str, str], float]]:
        """``read()`` while no charge is written; returns what was read and every charge
        not written yet, by (counter hash, member), and every planned load not published
        yet, by (``LOADS``, its member): when it ends."""


def _count_input(w: WorkerView, batch: str, n: float) -> WorkerView:
    """``w`` with ``n`` more inputs of batch key ``batch`` waiting (never below zero)."""
    inputs = dict(w.queued_inputs)
    left = max(0, round(inputs.get(batch, 0) + n))
    if left:
        inputs[batch] = left
    else:
        inputs.pop(batch, None)
    return evolve(w, queued_inputs=inputs)


def _planning(snap: Snapshot, unflushed: dict[tuple[str, str], float]) -> Snapshot:
    """``snap`` with this process's planned loads not published yet (``unflushed``'s
    LOADS entries) added to its planned loads."""
    mine = [(split_member(member), ends) for (table, member), ends in unflushed.items()
            if table == LOADS]
    if not mine:
        return snap
    planned = {worker: dict(loads) for worker, loads in snap.planned_loads.items()}
    for (worker, model), ends in mine:
        at = planned.setdefault(worker, {})
        at[model] = max(at.get(model, ends), ends)
    return replace(snap, planned_loads=planned)


def _charged(snap: Snapshot, charges: dict[tuple[str, str], float]) -> Snapshot:
    """``snap`` with ``charges`` ((counter hash, member) -> amount: a worker's total
    backlog, its queued work at one level, or a count of its queued inputs of a batch
    key, as the ledger names them; a planned load's entry is not a charge) added to the
    views."""
    charges = {k: ms for k, ms in charges.items() if k[0] != LOADS}
    if not charges:
        return snap
    by_worker: dict[str, list[tuple[int | None, str | None, float]]] = {}
    for (table, member), ms in charges.items():
        worker, part = split_member(member) if table not in ("backlog", "pending") \
            else (member, "")
        level = int(part) if table in ("queued", "pending_queued") else None
        batch = part if table == "forming" else None
        by_worker.setdefault(worker, []).append(
            (level, batch, table in ("pending", "pending_queued"), ms))

    def charged(w: WorkerView) -> WorkerView:
        for level, batch, pending, ms in by_worker[w.name]:
            w = _count_input(w, batch, ms) if batch is not None else \
                _charge(w, ms, pending=pending, level=level, total=level is None)
        return w
    workers = tuple(charged(w) if w.name in by_worker else w for w in snap.workers)
    return replace(snap, workers=workers)
