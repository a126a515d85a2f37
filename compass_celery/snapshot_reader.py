"""The snapshot cache producers read through: one store read per ``ttl_s``.

A burst of enqueues in one process plans against one snapshot, and the process's own
backlog charges are folded into it as they are made, so the burst spreads over the
workers instead of piling onto the one that looked idle when the snapshot was taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from .planner.cost import evolve
from .planner.types import WorkerView
from .state import Snapshot, StateStore, StateUnavailable

logger = logging.getLogger("compass_celery.state")


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
        self._index: dict[str, int] = {}
        self._indexed: tuple[WorkerView, ...] | None = None
        self._reported: set[str] = set()
        self.reads = 0
        self.retry_after_s = 1.0  # after a failed read, fail fast this long (Redis is away)
        self._down_until, self._down_why = 0.0, ""

    def expired(self, now: float | None = None) -> bool:
        """Whether the next :meth:`get` reads the store (no snapshot, or one over ``ttl_s``)."""
        snap, now = self._snap, self.clock() if now is None else now
        return snap is None or now - snap.taken_at > self.ttl_s

    def get(self) -> Snapshot:
        """The cached snapshot while younger than ``ttl_s``, else a fresh one."""
        now = self.clock()
        with self._lock:
            if not self.expired(now):
                return self._snap  # type: ignore[return-value]  # not expired: held
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
        """Add ``ms`` to ``worker``'s backlog in this process's snapshot only."""
        with self._lock:
            snap = self._snap
            if snap is None:
                return
            workers = snap.workers
            if self._indexed is not workers:  # positions by name, kept while they hold
                self._index = {w.name: i for i, w in enumerate(workers)}
            i = self._index.get(worker)
            if i is None:
                return
            w = workers[i]
            workers = (*workers[:i], evolve(w, backlog_ms=max(0.0, w.backlog_ms + ms)),
                       *workers[i + 1:])
            self._indexed = workers
            self._snap = replace(snap, workers=workers)

    def invalidate(self) -> None:
        """Drop the cached snapshot: the next ``get`` reads the store."""
        with self._lock:
            self._snap = None

