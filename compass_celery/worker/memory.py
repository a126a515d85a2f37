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

CPython's own full collections still come when the quarter rule says, inside whatever task
is running, and each walks that whole long-lived heap: tens of ms (up to 150 ms on a busy
2-core host), the tail of a job's hops. So the worker freezes the heap it started with
(:func:`freeze_startup_heap`, ``gc.freeze``) before it loads any model: every collection,
its own and this one, walks only what was made since. What start-up made and later drops
is freed by reference counting as before; only a reference cycle of it would stay.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

#: While waiting for a moment between tasks, how often to look (s).
IDLE_POLL_S = 0.05


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (the imported libraries, the app,
    the worker's own machinery) into the permanent generation, out of every later
    collection's walk; -> how many objects were frozen. Called before any model loads,
    so that a model's objects, evicted later, are collected like any other. Off the main
    thread it does nothing (-> 0): a worker started inside another program (Celery's
    ``start_worker`` in a test suite runs it in a thread) leaves that program's heap be."""
    if threading.current_thread() is not threading.main_thread():
        return 0
    gc.collect()  # start-up's own garbage is freed, not frozen
    gc.freeze()
    return gc.get_freeze_count()


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
