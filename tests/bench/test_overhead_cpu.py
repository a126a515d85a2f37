"""The overhead benchmark's CPU a task and a job, for Celery's chain and compass's Dag."""

import os
import subprocess
import sys
import time

import pytest

from compass_celery.bench.overhead import Alternated

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_each_kind_is_charged_the_cpu_spent_while_it_ran():
    worker = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        runs = Alternated([worker.pid])
        runs.time("chain", lambda: _spin(0.06))  # the producer's own CPU
        runs.time("dag", lambda: time.sleep(0.05))  # waits: no CPU
        lines: list[str] = []
        runs.report(lines.append)
    finally:
        worker.kill()
        worker.wait()
    assert runs.cpu_s["chain"][1] >= 0.05 and runs.cpu_s["dag"][1] < 0.02
    assert len(runs.ms["chain"]) == len(runs.ms["dag"]) == 1
    producer = next(line for line in lines if "producer" in line)
    chain_ms, dag_ms = (float(x) for x in producer.split("ms:")[1].split("/"))
    assert chain_ms >= 50 and dag_ms < 20  # a job each
    assert any(line.startswith("Dag / chain") for line in lines)
