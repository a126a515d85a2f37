"""A worker's time scale: real seconds per workload second (``compass_time_scale``).

An emulated GPU sleeps its workload times the scale, so what the worker times on the
wall clock (runs, queueing, the gaps between tasks) it learns and reports in workload
ms, the unit of plans and run times, on a scaled emulated cluster as on a real one.
"""

from __future__ import annotations


def workload_ms(real_s: float, time_scale: float) -> float:
    """``real_s`` wall-clock seconds as workload milliseconds (over ``time_scale``)."""
    return real_s * 1000.0 / time_scale


def wall_s(ms: float, time_scale: float) -> float:
    """``ms`` workload milliseconds as wall-clock seconds (times ``time_scale``): how long a
    worker really waits for a span the planner counts in workload ms."""
    return ms * time_scale / 1000.0
