"""The worker's periodic full garbage collection: on its clock, between tasks, never
when turned off (the soak benchmark measures what it does to RSS)."""

from __future__ import annotations

import gc
import threading
import time

from compass_celery.local import wait_until
from compass_celery.worker.memory import FullCollector


def _run(collector: FullCollector, stopping: threading.Event, until, what: str) -> float:
    """Run the collector's loop until ``until()`` holds, stop it; the seconds it ran."""
    t = threading.Thread(target=collector.loop, daemon=True)
    started = time.monotonic()
    t.start()
    try:
        wait_until(until, 10, what, interval=0.005)
    finally:
        stopping.set()
        t.join(2)
    assert not t.is_alive()
    return time.monotonic() - started


def test_collects_on_its_clock_and_waits_for_a_moment_between_tasks():
    stopping, busy, calls, asked = threading.Event(), [1], [], []

    def running() -> int:
        asked.append(busy[0])
        return busy[0]
    # its clock stands still: the "whole further interval" never passes, so it is only
    # a moment between tasks that can let it collect
    collector = FullCollector(0.1, running, stopping, collect=lambda: calls.append(busy[0]),
                              clock=lambda: 0.0)
    t = threading.Thread(target=collector.loop, daemon=True)
    t.start()
    try:  # due, but a task runs: it asks again and again, and waits
        wait_until(lambda: len(asked) >= 3, 10, "the collector to ask while due")
        assert calls == []
        busy[0] = 0  # the task ends: it collects, between tasks
        wait_until(lambda: calls, 10, "a collection between tasks", interval=0.005)
    finally:
        stopping.set()
        t.join(2)
    assert not t.is_alive()
    assert set(calls) == {0} and collector.collections == len(calls)


def test_a_worker_never_idle_still_collects_after_a_further_interval():
    stopping, calls = threading.Event(), []
    collector = FullCollector(0.05, lambda: 1, stopping, collect=lambda: calls.append(1))
    ran_s = _run(collector, stopping, lambda: len(calls) >= 2, "two collections")
    # never skipped for good (two came), and each took its interval plus a further one:
    # a slow machine can only make them rarer (10 ms: the timers' granularity)
    assert len(calls) * 2 * 0.05 <= ran_s + 0.01, (len(calls), ran_s)


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
        _run(FullCollector(0.05, lambda: 0, stopping := threading.Event()), stopping,
             lambda: full, "a full collection")
    finally:
        gc.callbacks.remove(note)
    assert full  # gc.collect(): a generation-2 (full) collection


def test_the_start_up_heap_is_frozen_and_what_comes_after_is_still_collected():
    """freeze_startup_heap takes what is alive at start-up out of every collection's walk
    (a full collection no longer pauses a task for the whole library heap), while an
    object made afterwards (a model loaded later), dropped in a reference cycle, is still
    collected. In a child interpreter: freezing pytest's own heap is not this test's."""
    import subprocess
    import sys

    code = """
import gc, threading, weakref
from compass_celery.worker.memory import freeze_startup_heap
class Model:
    pass
embedded = []  # a worker run in a thread of another program leaves its heap be
t = threading.Thread(target=lambda: embedded.append(freeze_startup_heap()))
t.start(); t.join()
assert embedded == [0] and gc.get_freeze_count() == 0, embedded
frozen = freeze_startup_heap()
assert frozen > 1000 and gc.get_freeze_count() == frozen, frozen
m = Model(); m.self = m  # a cycle, as a model's modules may hold
alive = weakref.ref(m)
del m
gc.collect()
assert alive() is None, "a later object's cycle was not collected"
print("ok", frozen)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout + done.stderr
