"""The prefetch loop's clock: while a task runs it peeks the queue every
``compass_prefetch_poll_s`` and asks the cache only when the queued models change; at 0
it peeks only when a task starts (tested on the loop itself, with a stand-in queue and
cache; the real-worker behaviour is in test_prefetch_on_arrival)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from compass_celery.local import wait_until
from compass_celery.settings import resolve
from compass_celery.worker.task_path import TaskPath


def _path(poll_s: float, queued: list[str]) -> tuple[TaskPath, list[list[str]], list[int]]:
    asked: list[list[str]] = []
    peeks: list[int] = []
    path = TaskPath.__new__(TaskPath)  # only what the loop touches
    path.cfg = resolve({"compass_prefetch_poll_s": poll_s, "compass_prefetch_depth": 3})
    path._stopping, path._prefetch_due, path._lock = (threading.Event(), threading.Event(),
                                                      threading.Lock())
    path._running = {"t1": (None, "small", True, 0.0)}  # one task runs all along

    def peek(depth: int) -> list[SimpleNamespace]:
        peeks.append(depth)
        return [SimpleNamespace(model=m) for m in queued]
    path._queued = peek
    path.cache = SimpleNamespace(prefetch=lambda models: asked.append(list(models)))
    return path, asked, peeks


class _CountingEvent(threading.Event):
    """An Event that counts the waits begun on it: a second begun, the first is over."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def _run_until(path: TaskPath, until, what: str) -> float:
    """Run the loop until ``until()`` holds, stop it; the seconds that took."""
    t = threading.Thread(target=path.prefetch_loop, daemon=True)
    started = time.monotonic()
    t.start()
    try:
        took = wait_until(until, 10, what, interval=0.005) and time.monotonic() - started
    finally:
        path._stopping.set()
        path.stop()
        t.join(3)
    assert not t.is_alive()
    return took


def test_while_a_task_runs_the_queue_is_peeked_and_a_change_asked_for_once():
    queued = ["big"]
    path, asked, peeks = _path(0.02, queued)
    took = _run_until(path, lambda: len(peeks) >= 5, "five peeks")
    # every 20 ms: five peeks in far less than the 1 s wait each that no polling would take
    assert took < 4.0, took
    assert asked == [["big"]]  # the same models again ask for nothing


def test_at_zero_it_peeks_only_when_a_task_starts():
    path, asked, peeks = _path(0.0, ["big"])
    path._prefetch_due = due = _CountingEvent()
    # until the loop's 1 s wait has timed out and it waits again: a timeout alone must
    # not peek
    _run_until(path, lambda: due.waits >= 2, "the loop's wait to time out")
    assert peeks == [] and asked == []
    path2, asked2, _ = _path(0.0, ["big"])
    path2._prefetch_due.set()  # a task started
    _run_until(path2, lambda: asked2, "a peek for the started task")
    assert asked2 == [["big"]]
