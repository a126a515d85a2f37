"""The per-policy result record from job outcomes: one shape for the bench and the simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class JobOutcome:
    """One job as the submitting process saw it; times in workload ms."""

    index: int
    dag: str
    arrival_ms: float
    end_ms: float | None = None
    failed: bool = False


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float]:
    """Mean, p50, p95 and p99 of ``latencies_ms``, rounded to 3 decimals (zeros if empty)."""
    lat = np.asarray(latencies_ms, dtype=float)
    if not lat.size:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return {"mean": round(float(lat.mean()), 3), "p50": round(float(p50), 3),
            "p95": round(float(p95), 3), "p99": round(float(p99), 3)}


def policy_result(jobs: Sequence[JobOutcome], warmup_frac: float, hits: int, misses: int,
                  loads: int) -> dict[str, object]:
    """Counts cover every job; latencies leave out the first ``warmup_frac`` as warm-up."""
    completed = [j for j in jobs if j.end_ms is not None and not j.failed]
    failed = sum(1 for j in jobs if j.failed)
    skip = int(len(jobs) * warmup_frac)
    lat = [j.end_ms - j.arrival_ms for j in completed if j.index >= skip]  # type: ignore[operator]
    span_s = 0.0
    if completed:
        span_s = (max(j.end_ms for j in completed)  # type: ignore[type-var]
                  - min(j.arrival_ms for j in jobs)) / 1000.0
    return {
        "jobs": len(jobs),
        "completed": len(completed),
        "failed": failed,
        "lost": len(jobs) - len(completed) - failed,
        "latency_ms": latency_summary(lat),
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "model_loads": loads,
        "throughput_jobs_per_s": round(len(completed) / span_s, 3) if span_s > 0 else 0.0,
    }


def duplicate_count(executions: Mapping[str, int]) -> int:
    """Executions beyond the first, summed over task ids: what at-least-once cost."""
    return sum(max(0, int(n) - 1) for n in executions.values())


def duplicated_ids(executions: Mapping[str, int], limit: int = 20) -> list[str]:
    """Task ids that ran more than once (a few, sorted), to look up in worker logs."""
    return sorted(t for t, n in executions.items() if int(n) > 1)[:limit]
