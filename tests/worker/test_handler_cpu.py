"""What compass's task handlers cost a task in CPU, model loads left out."""

import threading
import time

from compass_celery.worker.overhead import HandlerCpu


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_measures_cpu_not_waiting_and_leaves_out_what_is_excluded():
    cpu = HandlerCpu()
    assert cpu.per_task_ms() is None  # nothing handled yet
    with cpu.measure():
        _spin(0.05)
        time.sleep(0.1)  # waiting costs no CPU
        with cpu.excluding():  # a model load: the model's cost
            _spin(0.2)
    cpu.task_done()
    ms, tasks = cpu.totals()
    assert tasks == 1 and 45 <= ms < 120, ms
    with cpu.measure():
        _spin(0.03)
    cpu.task_done()
    assert cpu.totals()[1] == 2
    assert cpu.per_task_ms() == cpu.totals()[0] / 2


def test_threads_each_count_their_own_time():
    cpu = HandlerCpu()

    def handle() -> None:
        with cpu.measure():
            _spin(0.02)
            with cpu.excluding():
                _spin(0.05)
        cpu.task_done()

    threads = [threading.Thread(target=handle) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms, tasks = cpu.totals()
    assert tasks == 4 and 70 <= ms < 200, ms  # 4 x 20 ms, the excluded 4 x 50 ms left out
