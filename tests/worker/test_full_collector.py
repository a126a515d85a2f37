"""The worker's periodic full garbage collection: on its clock, between tasks, never
when turned off (the soak benchmark measures what it does to RSS)."""

from __future__ import annotations

import gc
import threading
import time

from compass_celery.worker.memory import FullCollector


def _run(collector: FullCollector, stopping: threading.Event, seconds: float) -> None:
    t = threading.Thread(target=collector.loop, daemon=True)
    t.start()
    time.sleep(seconds)
    stopping.set()
    t.join(2)
    assert not t.is_alive()


def test_collects_on_its_clock_and_waits_for_a_moment_between_tasks():
    stopping, busy, calls = threading.Event(), [1], []
    collector = FullCollector(0.1, lambda: busy[0], stopping,
                              collect=lambda: calls.append(busy[0]))
    t = threading.Thread(target=collector.loop, daemon=True)
    t.start()
    time.sleep(0.15)  # due, but a task runs: it waits
    assert calls == []
    busy[0] = 0  # the task ends: it collects, between tasks
    time.sleep(0.1)
    stopping.set()
    t.join(2)
    assert calls and set(calls) == {0} and collector.collections == len(calls)


def test_a_worker_never_idle_still_collects_after_a_further_interval():
    stopping, calls = threading.Event(), []
    collector = FullCollector(0.05, lambda: 1, stopping, collect=lambda: calls.append(1))
    _run(collector, stopping, 0.3)
    assert 1 <= len(calls) <= 3  # every 2 intervals at most, never skipped for good


def test_zero_turns_it_off_and_the_default_runs_a_real_full_collection():
    stopping = threading.Event()
    off = FullCollector(0, lambda: 0, stopping)
    off.loop()  # returns at once
    assert off.collections == 0
    full = []

    def note(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full.append(info)
    gc.callbacks.append(note)
    try:
        _run(FullCollector(0.05, lambda: 0, stopping := threading.Event()), stopping, 0.2)
    finally:
        gc.callbacks.remove(note)
    assert full  # gc.collect(): a generation-2 (full) collection
