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
    result.update(load_fraction(jobs, cluster, warmup_frac))
    result["breakdown_ms"] = breakdown(jobs, warmup_frac)
    result["plan_ms"] = plan_summary(plan_ns)
    return result


def load_fraction(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float
                  ) -> dict[str, float]:
    """Model loads after warm-up, and their share of the tasks after warm-up.

    Warm-up ends when the first job after the warm-up fraction arrives (as latencies leave
    out the first ``warmup_frac`` of jobs); a load counts from the moment it started, so
    prefetches count too. ``load_fraction`` = loads after warm-up / tasks of the jobs
    after warm-up: the share of tasks that paid (or had prefetched) a model load.
    """
    skip = int(len(jobs) * warmup_frac)
    late = [j for j in jobs if j.index >= skip]
    if not late:
        return {"loads_after_warmup": 0, "load_fraction": 0.0}
    loads = cluster.loads_since(min(j.arrival for j in late))
    tasks = sum(len(j.dag.nodes) for j in late)
    return {"loads_after_warmup": loads, "load_fraction": round(loads / tasks, 4)}


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
