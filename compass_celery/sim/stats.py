"""Turn finished simulated jobs into the benchmark's per-policy result record."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..results import JobOutcome, TaskRun, left_capacity_share, policy_result, window_batch_share
from ..results import slo_table as stats_slo_table
from .cluster import SimCluster

BREAKDOWN_KEYS = ("queued_ms", "load_ms", "hop_ms", "run_ms")


def summarize(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float,
              plan_ns: Sequence[int] = ()) -> dict[str, Any]:
    """The same record as the real benchmark's, through the same function, plus the
    per-task breakdown (same keys as the benchmark's, and the modelled hop) and
    ``plan_ms``, the wall time of each policy's plan call. Jobs carry their SLO outcome
    (rejected, shed, late) so the record has the benchmark's ``slo`` section; ``tasks``
    counts tasks started and those never run: dropped at their latest start, revoked
    with their shed job, or withheld (released too late), when admission had anything
    to judge."""
    outcomes = [outcome(j) for j in jobs]
    hits, misses, loads = cluster.totals()
    result = policy_result(outcomes, warmup_frac, hits, misses, loads)
    if any(j.slo is not None or j.rejected for j in jobs):  # else the record is as before
        result["tasks"] = {"run": cluster.started, "dropped": cluster.dropped,
                           "revoked": cluster.revoked, "withheld": cluster.withheld}
    result.update(load_fraction(jobs, cluster, warmup_frac))
    result["breakdown_ms"] = breakdown(jobs, warmup_frac)
    result["plan_ms"] = plan_summary(plan_ns)
    result["finish_error"] = finish_error(jobs, warmup_frac)
    if cluster.batches:  # batched passes ran: else the record is as before
        result["batching"] = batch_summary(jobs, cluster, warmup_frac)
    result.update(batch_shares(jobs, outcomes, len(cluster.workers)))
    return result


def batch_shares(jobs: Sequence[Any], outcomes: Sequence[JobOutcome], gpus: int
                 ) -> dict[str, Any]:
    """The bench's two batch shares, by the same functions: over the whole run from
    declared run times (``batch_share``) and over the overloaded window from each task's
    run (``batch_share_window``); neither when the jobs are not of both kinds."""
    out: dict[str, Any] = {}
    work = {j.dag.name: sum(n.exec_ms for n in j.dag.nodes.values()) for j in jobs}
    share = left_capacity_share(outcomes, work, gpus)
    if share is not None:
        out["batch_share"] = share
    runs = [TaskRun(end - j.run_ms.get(node, 0.0), end, o.deadline_ms is None)
            for j, o in zip(jobs, outcomes, strict=True) for node, end in j.finish.items()]
    window = window_batch_share(outcomes, runs, gpus)
    if window is not None:
        out["batch_share_window"] = window
    return out


#: Batch-size buckets of the ``batching.sizes`` histogram (upper bounds, inclusive).
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def batch_summary(jobs: Sequence[Any], cluster: SimCluster, warmup_frac: float
                  ) -> dict[str, Any]:
    """Batched passes: how many, their sizes (mean, p50, p99, histogram by bucket), and
    the latency holding batches open added: per pass and per task after warm-up (p50,
    p99, max ms), and the share of passes that were held at all."""
    sizes = np.asarray(cluster.batches, dtype=float)
    holds = np.asarray(cluster.holds, dtype=float)
    skip = int(len(jobs) * warmup_frac)
    held = np.asarray([h for j in jobs if j.index >= skip for h in j.held]
                      or [0.0])
    hist: dict[str, int] = {}
    lo = 1
    for hi in (*SIZE_BUCKETS, np.inf):
        label = str(lo) if lo == hi else (f"{lo}-{hi}" if hi < np.inf else f"{lo}+")
        count = int(((sizes >= lo) & (sizes <= hi)).sum())
        if count:
            hist[label] = count
        lo = int(hi) + 1 if hi < np.inf else lo
    q = lambda a, p: round(float(np.percentile(a, p)), 3)  # noqa: E731
    return {"passes": len(sizes), "inputs": int(sizes.sum()),
            "size": {"mean": round(float(sizes.mean()), 3), "p50": q(sizes, 50),
                     "p99": q(sizes, 99), "max": int(sizes.max())},
            "sizes": hist,
            "held_share": round(float((holds > 0).mean()), 4),
            "hold_ms": {"p50": q(holds, 50), "p99": q(holds, 99),
                        "max": round(float(holds.max()), 3)},
            "task_hold_ms": {"p50": q(held, 50), "p99": q(held, 99),
                             "max": round(float(held.max()), 3)}}


def outcome(job: Any) -> JobOutcome:
    """One simulated job as the benchmark's submitting process would record it."""
    slo = job.slo
    return JobOutcome(job.index, job.dag.name, job.arrival, job.end, job.failed,
                      slo=slo.name if slo is not None else "",
                      deadline_ms=slo.deadline_ms if slo is not None else None,
                      rejected=job.rejected, shed=job.shed, late=job.late,
                      refused_for=job.refused_for)


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
    # a refused job sent nothing; a shed one, only what started before it was shed
    tasks = sum(sum(t.start_at >= 0 for t in j.tasks) if j.shed else len(j.dag.nodes)
                for j in late if not j.rejected)
    return {"loads_after_warmup": loads,
            "load_fraction": round(loads / tasks, 4) if tasks else 0.0}


def completed(jobs: Sequence[Any], warmup_frac: float) -> list[Any]:
    """The jobs after warm-up that ran to their end (not failed, shed or refused)."""
    skip = int(len(jobs) * warmup_frac)
    return [j for j in jobs if j.index >= skip and j.end is not None
            and not (j.failed or j.shed or j.rejected)]


def breakdown(jobs: Sequence[Any], warmup_frac: float) -> dict[str, float]:
    """Mean per task, workload ms, over the completed jobs after warm-up (as the benchmark).

    queued: from send until it started, less its model wait (shared queue, own queue,
    inputs still in transfer); load: from the worker turning to it until its model was
    resident; hop: the modelled dispatch overhead; run: its run time on that worker. The
    four add up to each task's time from send to finish.
    """
    sums = [0.0] * 5
    for j in completed(jobs, warmup_frac):
        for k in range(5):
            sums[k] += j.parts[k]
    n = sums[4]
    return {key: round(sums[k] / n, 3) if n else 0.0 for k, key in enumerate(BREAKDOWN_KEYS)}


def finish_error(jobs: Sequence[Any], warmup_frac: float) -> dict[str, float]:
    """How right each job's plan was about its finish, over the completed jobs after
    warm-up: the median of |simulated - predicted| / simulated, and the median error in
    ms (positive: later than planned). The real benchmark reports the same from its
    workers' measurements (``bench.terms``)."""
    done = [j for j in completed(jobs, warmup_frac)  # (shared queue: no estimate)
            if j.predicted_ms is not None and math.isfinite(j.predicted_ms)]
    if not done:
        return {"n": 0, "rel_err_median": 0.0, "bias_median_ms": 0.0}
    took = np.array([j.end - j.arrival for j in done])
    err = took - np.array([j.predicted_ms for j in done])
    return {"n": int(len(err)),
            "rel_err_median": round(float(np.median(np.abs(err) / np.maximum(took, 1.0))), 3),
            "bias_median_ms": round(float(np.median(err)), 2)}


def plan_summary(plan_ns: Sequence[int]) -> dict[str, float]:
    """p50/p99 planning time per job in ms (every planned job: planning cost has no warm-up)."""
    if not plan_ns:
        return {"p50": 0.0, "p99": 0.0}
    p50, p99 = np.percentile(np.asarray(plan_ns, dtype=float) / 1e6, [50, 99])
    return {"p50": round(float(p50), 4), "p99": round(float(p99), 4)}


def slo_table(result: dict[str, Any]) -> str:
    """Per policy and SLO class: what admission and shedding did and what met its
    deadline, in the benchmark's columns so the two read side by side, then what the
    simulator also knows: tasks started, and tasks never run (dropped, revoked or
    withheld); '' when no job had an SLO."""
    def tasks(r: Mapping[str, Any]) -> list[object]:
        t = r.get("tasks")
        if not t:
            return ["-", "-"]
        return [t["run"], sum(t[k] for k in ("dropped", "revoked", "withheld"))]

    return stats_slo_table(result, ["tasks run", "not run"], tasks)
