"""Turn finished simulated jobs into the benchmark's per-policy result record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..bench.stats import JobOutcome, policy_result
from .cluster import SimCluster

BREAKDOWN_KEYS = ("queued_ms", "load_ms", "hop_ms", "run_ms")


def summarize(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float,
              plan_ns: Sequence[int] = ()) -> dict[str, Any]:
    """The same record as the real benchmark's, through the same function, plus the
    per-task breakdown (same keys as the benchmark's, and the modelled hop) and
    ``plan_ms``, the wall time of each policy's plan call."""
    outcomes = [JobOutcome(j.index, j.dag.name, j.arrival, j.end, j.failed) for j in jobs]
    hits, misses, loads = cluster.totals()
    result = policy_result(outcomes, warmup_frac, hits, misses, loads)
    result["breakdown_ms"] = breakdown(jobs, warmup_frac)
    result["plan_ms"] = plan_summary(plan_ns)
    return result


def breakdown(jobs: Sequence[Any], warmup_frac: float) -> dict[str, float]:
    """Mean per task, workload ms, over the completed jobs after warm-up (as the benchmark).

    queued: from send until it started, less its model wait (shared queue, own queue,
    inputs still in transfer); load: from the worker turning to it until its model was
    resident; hop: the modelled dispatch overhead; run: its run time on that worker. The
    four add up to each task's time from send to finish.
    """
    skip = int(len(jobs) * warmup_frac)
    sums = [0.0] * 5
    for j in jobs:
        if j.index < skip or j.failed or j.end is None:
            continue
        for k in range(5):
            sums[k] += j.parts[k]
    n = sums[4]
    return {key: round(sums[k] / n, 3) if n else 0.0 for k, key in enumerate(BREAKDOWN_KEYS)}


def plan_summary(plan_ns: Sequence[int]) -> dict[str, float]:
    """p50/p99 planning time per job in ms (every planned job: planning cost has no warm-up)."""
    if not plan_ns:
        return {"p50": 0.0, "p99": 0.0}
    p50, p99 = np.percentile(np.asarray(plan_ns, dtype=float) / 1e6, [50, 99])
    return {"p50": round(float(p50), 4), "p99": round(float(p99), 4)}
