"""Turn finished simulated jobs into the benchmark's per-policy result record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..bench.stats import JobOutcome, policy_result
from .cluster import SimCluster


def summarize(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float) -> dict[str, Any]:
    """The same record as the real benchmark's, through the same function."""
    outcomes = [JobOutcome(j.index, j.dag.name, j.arrival, j.end, j.failed) for j in jobs]
    hits, misses, loads = cluster.totals()
    return policy_result(outcomes, warmup_frac, hits, misses, loads)
