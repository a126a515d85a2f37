"""The per-policy result record from job outcomes: one shape for the bench and the simulator."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .tables import text_table


@dataclass
class JobOutcome:
    """One job as the submitting process saw it; times in workload ms."""

    index: int
    dag: str
    arrival_ms: float
    end_ms: float | None = None
    failed: bool = False
    #: Its SLO class and deadline (workload ms from arrival; None: no deadline).
    slo: str = ""
    deadline_ms: float | None = None
    #: Refused by admission (``end_ms`` is then when the refusal reached the sender),
    #: shed (dropped unrun once it could no longer meet its deadline), or admitted
    #: although predicted to miss it.
    rejected: bool = False
    shed: bool = False
    late: bool = False
    #: Why it was refused (``Verdict.cause``: deadline, queue_full, cold); '' when taken,
    #: or when the refusal did not say.
    refused_for: str = ""

    @property
    def completed(self) -> bool:
        """Ended with its answer."""
        return self.end_ms is not None and not (self.failed or self.rejected or self.shed)

    @property
    def met(self) -> bool:
        """Answered by its deadline (any answer counts when it has none)."""
        return self.completed and (self.deadline_ms is None
                                   or self.end_ms - self.arrival_ms <= self.deadline_ms)


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
    completed = [j for j in jobs if j.completed]
    failed = sum(1 for j in jobs if j.failed)
    refused = sum(1 for j in jobs if j.rejected or j.shed)
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
        "lost": len(jobs) - len(completed) - failed - refused,
        "latency_ms": latency_summary(lat),
        "cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "model_loads": loads,
        "throughput_jobs_per_s": round(len(completed) / span_s, 3) if span_s > 0 else 0.0,
        **slo_result(jobs, warmup_frac),
    }


def job_records(jobs: Sequence[JobOutcome]) -> list[dict[str, object]]:
    """Every job as the bench JSON keeps it: template, SLO class, arrival and latency
    (workload ms; None when it gave no answer) and its outcome: ``met`` (answered, by its
    deadline if it had one), ``late`` (answered after it), ``rejected``, ``shed``,
    ``failed`` or ``lost``."""
    out = []
    for j in jobs:
        outcome = ("rejected" if j.rejected else "shed" if j.shed else "failed" if j.failed
                   else "lost" if j.end_ms is None else "met" if j.met else "late")
        latency = round(j.end_ms - j.arrival_ms, 3) if j.completed else None  # type: ignore[operator]
        out.append({"i": j.index, "dag": j.dag, "slo": j.slo, "arrival_ms": round(j.arrival_ms, 3),
                    "latency_ms": latency, "outcome": outcome})
    return out


def slo_result(jobs: Sequence[JobOutcome], warmup_frac: float) -> dict[str, object]:
    """Deadline outcomes, in all and per SLO class: admitted, rejected, shed, late (taken
    although predicted to miss), met, attainment (met / all jobs), goodput (met per second
    of the run), the latency of what completed and how fast a refusal reached its sender.
    Empty when no job had an SLO class. Counts cover every job after warm-up."""
    skip = int(len(jobs) * warmup_frac)
    scored = [j for j in jobs if j.index >= skip]
    if not any(j.slo for j in jobs) or not scored:
        return {}
    span_s = (max((j.end_ms or j.arrival_ms) for j in scored)
              - min(j.arrival_ms for j in scored)) / 1000.0
    classes = sorted({j.slo for j in scored})
    return {"slo": {"all": _slo_counts(scored, span_s),
                    **{c or "none": _slo_counts([j for j in scored if j.slo == c], span_s)
                       for c in classes}}}


def _slo_counts(jobs: Sequence[JobOutcome], span_s: float) -> dict[str, object]:
    met = sum(j.met for j in jobs)
    rejected = [j for j in jobs if j.rejected]
    admitted = len(jobs) - len(rejected)
    refusal_ms = [j.end_ms - j.arrival_ms for j in rejected  # type: ignore[operator]
                  if j.end_ms is not None]
    causes: dict[str, int] = {}
    for j in rejected:
        if j.refused_for:
            causes[j.refused_for] = causes.get(j.refused_for, 0) + 1
    return {"jobs": len(jobs), "admitted": admitted, "rejected": len(rejected),
            "refused_for": dict(sorted(causes.items())),
            "shed": sum(j.shed for j in jobs), "late": sum(j.late for j in jobs),
            "met": met,
            "attainment": round(met / len(jobs), 4) if jobs else 0.0,
            "admitted_attainment": round(met / admitted, 4) if admitted else 0.0,
            "goodput_jobs_per_s": round(met / span_s, 3) if span_s > 0 else 0.0,
            "latency_ms": latency_summary([j.end_ms - j.arrival_ms  # type: ignore[operator]
                                           for j in jobs if j.completed]),
            "rejection_ms": latency_summary(refusal_ms)}


def left_capacity_share(jobs: Sequence[JobOutcome], work_ms: Mapping[str, float],
                        gpus: int) -> dict[str, float] | None:
    """How much of the capacity that deadline work leaves the work without one used.

    Over every job: the span runs from the first arrival to the last no-deadline job's
    end; what is left is ``gpus`` x the span less the declared run time (``work_ms`` by
    template) of the deadline jobs that met their deadline; the share is the declared run
    time of the no-deadline jobs answered over what is left. None without both classes.
    A Dag's last steps run alone at the end of the span, so the share stays below 1."""
    batch = [j for j in jobs if j.deadline_ms is None]
    ends = [j.end_ms for j in batch if j.completed]
    if not ends or len(batch) == len(jobs) or not jobs:
        return None
    span_ms = max(ends) - min(j.arrival_ms for j in jobs)  # type: ignore[type-var]
    met_ms = sum(work_ms.get(j.dag, 0.0) for j in jobs if j.deadline_ms is not None and j.met)
    left_ms = gpus * span_ms - met_ms
    done_ms = sum(work_ms.get(j.dag, 0.0) for j in batch if j.completed)
    return {"span_ms": round(span_ms, 3), "left_ms": round(left_ms, 3),
            "done_ms": round(done_ms, 3),
            "share": round(done_ms / left_ms, 4) if left_ms > 0 else 0.0}


@dataclass(frozen=True)
class TaskRun:
    """One task's run on a GPU, in workload ms on the jobs' clock (``JobOutcome``'s):
    from its start to its end, its model already loaded; ``batch``: its job has no
    deadline."""

    start_ms: float
    end_ms: float
    batch: bool


def overloaded_window(jobs: Sequence[JobOutcome]) -> tuple[float, float, str] | None:
    """The window where work without a deadline could use every GPU the deadline work
    left: from the first arrival to the last arrival, or to the moment the no-deadline
    backlog (such jobs arrived, taken and not yet ended) first empties, if earlier. Its
    start, end and which of ``last_arrival`` or ``backlog_empty`` ended it; None without
    jobs."""
    if not jobs:
        return None
    start = min(j.arrival_ms for j in jobs)
    last = max(j.arrival_ms for j in jobs)
    # arrivals before ends at the same instant, so a job ending as another arrives does
    # not read as an empty backlog
    events = sorted([(j.arrival_ms, 0, 1) for j in jobs if _in_backlog(j)]
                    + [(j.end_ms, 1, -1) for j in jobs
                       if _in_backlog(j) and j.end_ms is not None])
    waiting = 0
    for at, _, step in events:
        if at >= last:
            break
        waiting += step
        if waiting == 0:
            return start, at, "backlog_empty"
    return start, last, "last_arrival"


def _in_backlog(job: JobOutcome) -> bool:
    return job.deadline_ms is None and not job.rejected


def _busy_ms(runs: Sequence[TaskRun], batch: bool, start: float, end: float) -> float:
    return sum(max(0.0, min(r.end_ms, end) - max(r.start_ms, start))
               for r in runs if r.batch == batch)


def window_batch_share(jobs: Sequence[JobOutcome], runs: Sequence[TaskRun],
                       gpus: int) -> dict[str, Any] | None:
    """How much of the GPU time deadline work leaves the work without one used, over the
    overloaded window only (:func:`overloaded_window`), so the tail where only the last
    Dags' dependent steps run does not count: the no-deadline tasks' run time inside the
    window over ``gpus`` x the window less the deadline tasks' run time inside it. Runs
    are measured per task (``runs``; a run crossing an edge counts its part inside), so
    model loads and per-task overheads count as capacity not used. The same function
    for the bench and the simulator. None without both kinds of job, or no window."""
    if all(j.deadline_ms is None for j in jobs) or all(j.deadline_ms is not None
                                                       for j in jobs):
        return None
    window = overloaded_window(jobs)
    if window is None or window[1] <= window[0]:
        return None
    start, end, ended = window
    urgent_ms = _busy_ms(runs, False, start, end)
    done_ms = _busy_ms(runs, True, start, end)
    left_ms = gpus * (end - start) - urgent_ms
    return {"window_ms": round(end - start, 3), "ends": ended,
            "left_ms": round(left_ms, 3), "done_ms": round(done_ms, 3),
            "share": round(done_ms / left_ms, 4) if left_ms > 0 else 0.0}


#: What the two batch-share lines mean, printed above them (bench and simulator alike).
BATCH_SHARE_HEADING = (
    "Share of the GPU capacity deadline work leaves that work without a deadline used:\n"
    "  whole run: declared run times of the jobs answered, from the first arrival to the "
    "last such job's end (its tail, where only the last Dags' steps run, counts against "
    "it);\n"
    "  window: measured task runs, from the first arrival to the last arrival or the "
    "moment the no-deadline backlog first empties (loads and per-task overheads count "
    "as capacity not used)")


def batch_share_lines(result: Mapping[str, Any]) -> str:
    """A line per policy with both batch shares (:func:`left_capacity_share`, whole run;
    :func:`window_batch_share`, the overloaded window); '' when no policy has either."""
    lines = []
    for name, r in result["policies"].items():
        whole, window = r.get("batch_share"), r.get("batch_share_window")
        if not whole and not window:
            continue
        cells = []
        if whole:
            cells.append(f"whole run {100 * whole['share']:.1f}% "
                         f"(span {whole['span_ms'] / 1000:.1f} s)")
        if window:
            cells.append(f"window {100 * window['share']:.1f}% "
                         f"({window['window_ms'] / 1000:.1f} s, to the "
                         f"{window['ends'].replace('_', ' ')})")
        lines.append(f"  {name:<16} " + "; ".join(cells))
    return "\n".join(lines)


def duplicate_count(executions: Mapping[str, int]) -> int:
    """Executions beyond the first, summed over task ids: what at-least-once cost."""
    return sum(max(0, int(n) - 1) for n in executions.values())


def duplicated_ids(executions: Mapping[str, int], limit: int = 20) -> list[str]:
    """Task ids that ran more than once (a few, sorted), to look up in worker logs."""
    return sorted(t for t, n in executions.items() if int(n) > 1)[:limit]


#: The columns of an SLO table, the benchmark's and the simulator's alike; each adds its
#: own after them (:func:`slo_table`). "taken late": admitted although predicted to miss
#: (``on_miss="late"``); "missed": admitted and not answered by the deadline, whatever the
#: cause (shed, answered late, failed).
SLO_COLUMNS = ["policy", "slo", "jobs", "admitted", "rejected", "refused for", "shed",
               "taken late", "missed", "attain", "adm attain", "goodput/s", "mean ms", "p99",
               "reject p99"]


def refused_for(causes: Mapping[str, int]) -> str:
    """A class's refusals by cause as a table cell: ``deadline 3, cold 1``; '-' if none."""
    return ", ".join(f"{cause} {n}" for cause, n in causes.items() if n) or "-"


def slo_table(result: Mapping[str, Any], extra_columns: Sequence[str] = (),
              extra: Callable[[Mapping[str, Any]], list[object]] = lambda r: []) -> str:
    """One row per policy and SLO class of a result's ``slo`` sections, then ``extra``'s
    cells for the policy's record under ``extra_columns``; '' when no job had a class."""
    rows = []
    for name, r in result["policies"].items():
        for cls, c in (r.get("slo") or {}).items():
            if cls == "all" and len(r["slo"]) == 2:
                continue  # one class: its row says it all
            rows.append([name, cls, c["jobs"], c["admitted"], c["rejected"],
                         refused_for(c.get("refused_for") or {}), c["shed"],
                         c["late"], c["admitted"] - c["met"], f"{c['attainment']:.3f}",
                         f"{c['admitted_attainment']:.3f}", f"{c['goodput_jobs_per_s']:.2f}",
                         f"{c['latency_ms']['mean']:.1f}", f"{c['latency_ms']['p99']:.1f}",
                         f"{c['rejection_ms']['p99']:.2f}", *extra(r)])
    if not rows:
        return ""
    return text_table([[str(x) for x in row] for row in rows], [*SLO_COLUMNS, *extra_columns])
