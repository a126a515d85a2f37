"""Discrete-event simulator: the real planner and cache-decision code on simulated clusters.

``simulate(workload, ["compass", "celery-default"], workers=1000)`` returns the same
JSON shape as the benchmark; ``compare_count_pending`` measures compass with and
without planned-not-sent work in its backlog estimate.
"""

from .runner import Simulation, compare_count_pending, simulate

__all__ = ["Simulation", "compare_count_pending", "simulate"]
