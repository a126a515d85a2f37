"""A worker's full garbage collections: run on a clock, between tasks, so its resident
set stays flat under a steady stream of tasks.

CPython runs a full (oldest-generation) collection only once the objects promoted since
the last one reach a quarter of those that survived it; a worker's long-lived heap (some
85,000 objects once Celery, kombu, redis and numpy are imported) makes that rare. Some
memory is freed only by a full collection (the interpreter's free lists, mostly tuples
here: every Redis command's arguments, every failure's code positions), and its blocks
are spread over pymalloc's arenas, which go back to the system only when entirely empty.
So RSS crept up 0.2 to 0.3 MB a minute per worker while the live objects stayed level.
One full collection a minute (tens of ms) keeps it flat; it waits for a moment when no
task runs, so that the pause falls between tasks rather than inside one.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

#: While waiting for a moment between tasks, how often to look (s).
IDLE_POLL_S = 0.05


class FullCollector:
    """Runs ``gc.collect()`` every ``interval_s`` (0: never), when ``running()`` says no
    task runs, or regardless once a whole further interval has passed."""

    def __init__(self, interval_s: float, running: Callable[[], int],
                 stopping: threading.Event, collect: Callable[[], object] = gc.collect,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self._running, self._stopping = interval_s, running, stopping
        self._collect, self._clock = collect, clock
        self.collections = 0

    def loop(self) -> None:
        """Until the worker stops: wait an interval, then collect between tasks."""
        if self.interval_s <= 0:
            return
        while not self._stopping.wait(self.interval_s):
            deadline = self._clock() + self.interval_s
            while self._running() and self._clock() < deadline:
                if self._stopping.wait(IDLE_POLL_S):
                    return
            self._collect()
            self.collections += 1
