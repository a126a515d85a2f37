"""The prefetch loop's clock: while a task runs it peeks the queue every
``compass_prefetch_poll_s`` and asks the cache only when the queued models change; at 0
it peeks only when a task starts (tested on the loop itself, with a stand-in queue and
cache; the real-worker behaviour is in test_prefetch_on_arrival)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from compass_celery.worker.task_path import TaskPath


def _path(poll_s: float, queued: list[str]) -> tuple[TaskPath, list[list[str]], list[int]]:
    asked: list[list[str]] = []
    peeks: list[int] = []
    path = TaskPath.__new__(TaskPath)  # only what the loop touches
    path.cfg = {"prefetch_poll_s": poll_s, "prefetch_depth": 3}
    path._stopping, path._prefetch_due, path._lock = (threading.Event(), threading.Event(),
                                                      threading.Lock())
    path._running = {"t1": (None, "small", True, 0.0)}  # one task runs all along

    def peek(depth: int) -> list[SimpleNamespace]:
        peeks.append(depth)
        return [SimpleNamespace(model=m) for m in queued]
    path._queued = peek
    path.cache = SimpleNamespace(prefetch=lambda models: asked.append(list(models)))
    return path, asked, peeks


def _run_for(path: TaskPath, seconds: float) -> None:
    t = threading.Thread(target=path.prefetch_loop, daemon=True)
    t.start()
    time.sleep(seconds)
    path._stopping.set()
    path.stop()
    t.join(3)
    assert not t.is_alive()


def test_while_a_task_runs_the_queue_is_peeked_and_a_change_asked_for_once():
    queued = ["big"]
    path, asked, peeks = _path(0.02, queued)
    _run_for(path, 0.3)
    assert len(peeks) >= 5  # every 20 ms
    assert asked == [["big"]]  # the same models again ask for nothing


def test_at_zero_it_peeks_only_when_a_task_starts():
    path, asked, peeks = _path(0.0, ["big"])
    _run_for(path, 1.3)  # past the loop's 1 s wait: a timeout alone must not peek
    assert peeks == [] and asked == []
    path2, asked2, _ = _path(0.0, ["big"])
    path2._prefetch_due.set()  # a task started
    _run_for(path2, 0.2)
    assert asked2 == [["big"]]
