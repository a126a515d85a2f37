"""Discrete-event simulator: the real planner, cache-decision and worker-core code on
simulated clusters (the simulator adds only the clock and the simulated GPU).

``simulate(workload, ["compass", "celery-default"], SimOptions(workers=1000))`` (or
``workers=1000`` as a keyword) returns the same
JSON shape as the benchmark (with its per-task ``breakdown_ms``), plus ``plan_ms``, the
wall time of each plan call; ``hop_ms`` models a real cluster's fixed per-task dispatch
overhead (0 by default). ``compare_count_pending`` measures compass with and without
planned-not-sent work in its backlog estimate. The planner's per-worker columns are kept
live (``columns.LiveColumns``), so runs of 100,000 jobs on 1,000 workers take minutes.
Jobs of templates a workload gives an SLO are admitted and shed by the planner's own
rules (``planner.admission``), as the real submit and workers do (``admission=``,
``max_queue_ms=``); the record's ``slo`` section then reads as the benchmark's. Their
nodes take their class's priority level and workers serve them by the real worker's
rules (``worker.core``: level with ageing, then age; ``priority_age_s=``).
"""

from .options import SimOptions
from .runner import Simulation, compare_count_pending, simulate

__all__ = ["SimOptions", "Simulation", "compare_count_pending", "simulate"]
