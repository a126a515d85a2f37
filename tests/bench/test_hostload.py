"""The benchmark's host figures: how busy the machine was and each role's CPU."""

import os
import subprocess
import sys

import pytest

from compass_celery.bench.hostload import HostLoad, host_line, summarise
from compass_celery.local import wait_until

linux = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")


def test_summary_counts_saturated_intervals_and_cpu_per_task():
    host = summarise([0.2, 0.5, 1.0, 0.96], {"workers": 3.0, "producer": 1.0}, 2.0, 2, 500,
                     busy_s=5.5)
    assert host["busy_median"] == pytest.approx(0.73)
    assert host["saturated_share"] == 0.5  # 1.0 and 0.96 are at least 95% busy
    assert host["cpu_ms_per_task"] == {"workers": 6.0, "producer": 2.0}
    assert host["others_cpu_s"] == 1.5  # busy time no role accounts for
    line = host_line(host)
    assert "2 cores" in line and "saturated in 50% of 4 samples" in line
    assert "workers 6.0 ms" in line and "other programs 1.5 CPU s" in line


def test_no_tasks_and_no_samples_say_so():
    host = summarise([], {"workers": 0.0}, 0.1, 4, 0)
    assert host["samples"] == 0 and "busy_median" not in host
    assert host["cpu_ms_per_task"] == {"workers": None}
    assert "no samples" in host_line(host)


@linux
def test_a_process_that_exits_keeps_its_cpu_and_the_machine_shows_busy():
    burner = subprocess.Popen([sys.executable, "-c",
                               "import time\nend = time.process_time() + 0.6\n"
                               "while time.process_time() < end: pass\n"])
    load = HostLoad({"burner": [burner.pid], "gone": [2 ** 22 + 12345]},
                    interval_s=0.05).start()
    burner.wait(30)
    reaped = len(load._busy)  # samples taken so far
    wait_until(lambda: len(load._busy) >= reaped + 2, 10,
               "two samples after it exited and was reaped")
    load.stop()
    host = load.summary(tasks=3)
    assert host is not None and host["samples"] >= 5
    assert 0.4 <= host["cpu_s"]["burner"] <= 1.5  # its 0.6 s of CPU, read before it exited
    assert host["cpu_s"]["gone"] == 0.0
    assert host["busy_p90"] >= 0.4 / host["cores"]  # one core spun for most of the window
    assert host["cpu_ms_per_task"]["burner"] == pytest.approx(
        1000 * host["cpu_s"]["burner"] / 3, abs=0.01)
