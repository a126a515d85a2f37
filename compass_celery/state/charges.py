"""Backlog charges written to Redis off the enqueue path, in batches.

The router charges the chosen worker at once in this process's own snapshot
(``SnapshotReader.note_charge``): that is what keeps a burst from this process
off a single worker. Other processes need the charge in Redis too, but nothing
needs it there before the message itself is published, so the Redis write waits
for a flusher thread, which sends every charge gathered meanwhile in one
pipeline. An enqueue then pays no Redis round trip of its own for the charge.

A flush that finds Redis away drops its charges with a warning: every worker
reconciles its backlog from its own queue (``compass_reconcile_s``), which
corrects them.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

from .connection import StateUnavailable
from .keys import LOADS, loads_member
from .store import PlannedLoad, StateStore

logger = logging.getLogger("compass_celery.router")
T = TypeVar("T")


class ChargeBatcher:
    """Gathers backlog charges per worker, and the model loads this process planned, and
    writes them in one round trip per flush (one script call, with the loads' ZADD beside
    it when there are any)."""

    def __init__(self, store: StateStore, linger_s: float = 0.001) -> None:
        self.store, self.linger_s = store, linger_s
        self._lock = threading.Lock()
        # Held for a whole flush, so a caller's flush returns only once every charge it
        # could see (the flusher thread's in-flight batch included) is in Redis.
        self._flushing = threading.Lock()
        # (counter hash, member) -> amount not written yet
        self._pending: defaultdict[tuple[str, str], float] = defaultdict(float)
        # (worker, model) -> when a load planned there is to end, not published yet
        self._loads: dict[tuple[str, str], float] = {}
        self._wake = threading.Event()
        self._pid: int | None = None
        self.flushes = self.dropped = 0
        atexit.register(self.flush)

    def close(self) -> None:
        """Write what is gathered, stop the flusher thread, drop the exit hook."""
        self.flush()
        with self._lock:
            self._pid = None
        self._wake.set()
        atexit.unregister(self.flush)

    def add(self, member: str, ms: float, table: str = "backlog") -> None:
        """Charge ``ms`` to a counter in Redis within a flush: by default ``member`` is a
        worker's backlog; ``table`` names another (the ledger's entries)."""
        with self._lock:
            first = self._own_thread()
            self._pending[(table, member)] += ms
        if first:  # later ones join the flush already due (it swaps _pending out whole)
            self._wake.set()

    def plan_load(self, worker: str, model: str, ends: float) -> None:
        """Publish, within a flush, a load of ``model`` planned on ``worker`` to end at
        ``ends`` (unix s), for the other producers' next reads."""
        with self._lock:
            first = self._own_thread()
            self._loads[(worker, model)] = max(self._loads.get((worker, model), ends), ends)
        if first:
            self._wake.set()

    def _own_thread(self) -> bool:
        """Start this process's flusher on first use (a forked child too: its parent's
        gathered writes are not its own); whether nothing is gathered yet (called with the
        lock held): the flusher waits for a batch's first write only."""
        if self._pid != os.getpid():
            self._pending.clear()
            self._loads.clear()
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="compass-charges", daemon=True).start()
        return not self._pending and not self._loads

    def flush(self) -> int:
        """Write every gathered charge now, after any flush under way; returns how many
        counters it wrote."""
        with self._flushing:
            return self._flush()

    def read_through(self, read: Callable[[], T]) -> tuple[T, dict[tuple[str, str], float]]:
        """``read()`` while no charge is written, so the read sees exactly the charges
        written before it started; returns what it read and every charge not written yet
        (gathered before or during the read), which the caller folds into what it read.
        The read waits for no write of its own: the flusher writes them afterwards."""
        with self._flushing:
            result = read()
            with self._lock:
                mine = self._pid == os.getpid()
                unflushed = dict(self._pending) if mine else {}
                loads = dict(self._loads) if mine else {}
        unflushed = {w: ms for w, ms in unflushed.items() if ms}
        unflushed.update(((LOADS, loads_member(worker, model)), ends)
                         for (worker, model), ends in loads.items())
        return result, unflushed

    def _flush(self) -> int:
        with self._lock:
            if self._pid != os.getpid():
                return 0  # a forked child's copy of its parent's charges is not its own
            batch, self._pending = self._pending, defaultdict(float)
            loads, self._loads = self._loads, {}
        batch = {w: ms for w, ms in batch.items() if ms}
        if not batch and not loads:
            return 0
        try:  # one write for the whole batch
            self._write([(table, member, ms, "add") for (table, member), ms in batch.items()],
                        [(worker, model, ends) for (worker, model), ends in loads.items()])
        except StateUnavailable as exc:
            self.dropped += len(batch)
            logger.warning("compass: %d backlog charge(s) and %d planned load(s) not written "
                           "(%s); the workers' reconciliation corrects the charges",
                           len(batch), len(loads), exc)
            return 0
        self.flushes += 1
        return len(batch)

    def _write(self, changes: list[tuple[str, str, float, str]],
               loads: list[PlannedLoad]) -> None:
        """The counter changes and the planned loads, in one round trip."""
        if not loads:
            self.store.count(changes)
            return
        pipe = self.store.client.pipeline(transaction=False)
        if changes:
            self.store.count(changes, pipe)
        self.store.plan_loads(loads, pipe)
        self.store.execute(pipe)

    def _run(self) -> None:
        pid = os.getpid()
        while self._pid == pid:
            self._wake.wait()
            self._wake.clear()
            if self.linger_s:  # let a burst's other charges join this flush
                time.sleep(self.linger_s)
            try:
                self.flush()
            except Exception:  # the flusher must outlive anything one flush meets
                logger.exception("compass: backlog charge flush failed")
