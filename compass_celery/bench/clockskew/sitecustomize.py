"""Skew this Python process's wall clock by ``COMPASS_CLOCK_SKEW_S`` seconds.

Put this folder first on ``PYTHONPATH`` of a worker to give it a host clock that
disagrees with everybody else's (the benchmark's ``--skew-clock-s`` and the
clock-skew fault test do). Monotonic clocks are left alone, as NTP leaves them.
"""

import os
import time

_skew = float(os.environ.get("COMPASS_CLOCK_SKEW_S", "0") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
