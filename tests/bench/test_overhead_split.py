"""The enqueue benchmark's CPU split: this thread's CPU per kind of enqueue, and the CPU
other threads spent meanwhile, per routed enqueue."""

import threading
import time

from compass_celery.bench.overhead import CpuSplit


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_each_kind_gets_its_own_thread_cpu_and_other_threads_are_apart():
    cpu = CpuSplit()
    helper = threading.Thread(target=_spin, args=(0.08,))  # compass's thread, say
    wall = cpu.timed("compass", lambda: (helper.start(), _spin(0.03), helper.join()))
    cpu.timed("plain", lambda: time.sleep(0.03))  # waits: no CPU of its own
    cpu.stop()
    lines: list[str] = []
    cpu.report(64, lines.append)
    assert len(wall) == 1 and wall[0] >= 30_000  # µs
    assert cpu.thread_s["compass"] >= 0.025 and cpu.thread_s["plain"] < 0.01
    assert cpu.others_s >= 0.06  # the helper's CPU, not this thread's
    (line,) = lines
    numbers = line.split("µs:")[1]
    plain = float(numbers.split("plain ")[1].split(",")[0])
    others = float(numbers.split("threads ")[1])
    assert plain < 10_000 and others >= 60_000
