"""Turn finished simulated jobs into the benchmark's per-policy result record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .cluster import SimCluster


def summarize(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float) -> dict[str, Any]:
    """Counts cover every job; latencies leave out the first ``warmup_frac`` as warm-up."""
    completed = [j for j in jobs if j.end is not None and not j.failed]
    failed = sum(1 for j in jobs if j.failed)
    skip = int(len(jobs) * warmup_frac)
    lat = np.array([j.end - j.arrival for j in completed if j.index >= skip], dtype=float)
    if lat.size:
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        latency = {"mean": float(lat.mean()), "p50": float(p50), "p95": float(p95),
                   "p99": float(p99)}
    else:
        latency = {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    hits, misses, loads = cluster.totals()
    span_s = 0.0
    if completed:
        span_s = (max(j.end for j in completed) - min(j.arrival for j in jobs)) / 1000.0
    return {
        "jobs": len(jobs),
        "completed": len(completed),
        "failed": failed,
        "lost": len(jobs) - len(completed) - failed,
        "latency_ms": {k: round(v, 3) for k, v in latency.items()},
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "model_loads": loads,
        "throughput_jobs_per_s": round(len(completed) / span_s, 3) if span_s > 0 else 0.0,
    }
