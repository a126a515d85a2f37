"""The benchmark's deadlines: each job sent with its template's SLO class, and what became
of it (refused at submission, shed unrun, admitted late, met) read back from its record.

Kept apart from the runner so that the accounting is testable without a cluster: a
refusal is timed around ``apply_async`` (what a caller waits for a "no"), a job that
ended with ``DeadlineMissed`` was shed, not failed, and neither counts as lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import Rejected
from ..planner.admission import Slo
from ..results import JobOutcome, TaskRun
from ..results import slo_table as stats_slo_table

#: The error type a job dropped for its deadline ends with (``JobHandle.error``).
SHED_ERROR = "DeadlineMissed"


def submit(dag: Any, outcome: JobOutcome, slo: Slo | None,
           clock: Callable[[], float]) -> Any | None:
    """Send one job with its SLO class; -> its handle, or None when admission refused it
    (``outcome`` then says so, ended when the refusal came back). Any other error
    propagates: the caller counts it as a failed submission."""
    kwargs: dict[str, Any] = {}
    if slo is not None:
        outcome.slo, outcome.deadline_ms = slo.name, slo.deadline_ms
        kwargs = {"slo": slo.name, "deadline_ms": slo.deadline_ms}
    outcome.arrival_ms = clock()  # timed tight around the call: a refusal's wait is this
    try:
        return dag.apply_async(**kwargs)
    except Rejected as exc:
        outcome.end_ms, outcome.rejected = clock(), True
        outcome.refused_for = exc.cause
        return None


def apply_record(outcome: JobOutcome, error: Any, late: Any) -> None:
    """Fold a job record's ``error`` and ``late`` fields into ``outcome``: a failure whose
    error is ``DeadlineMissed`` was shed (dropped for its deadline), not failed."""
    if _text(late) == "1":
        outcome.late = True
    if not outcome.failed or error is None:
        return
    try:
        exc_type = json.loads(_text(error)).get("exc_type")
    except (ValueError, AttributeError):
        return
    if exc_type == SHED_ERROR:
        outcome.failed, outcome.shed = False, True


def read_records(handles: Iterable[tuple[JobOutcome, Any]]) -> None:
    """Read every ended job's ``error`` and ``late`` fields (one pipelined round trip per
    thousand jobs) and fold them in; a record already gone leaves its outcome as it is."""
    pairs = [(o, h) for o, h in handles if o.end_ms is not None and (o.failed or o.slo)]
    for i in range(0, len(pairs), 1000):
        chunk = pairs[i:i + 1000]
        try:
            pipe = chunk[0][1].client.pipeline(transaction=False)
            for _, handle in chunk:
                pipe.hmget(handle.keys.job, ["error", "late"])
            rows = pipe.execute()
        except Exception:  # Redis gone (a fault run): the done lists already counted them
            continue
        for (outcome, _), (error, late) in zip(chunk, rows, strict=True):
            apply_record(outcome, error, late)


def run_of(timing: dict[str, Any], wall0_s: float, time_scale: float,
           batch: bool) -> TaskRun | None:
    """One node's timing record (``finished``: wall s; ``run_ms``: workload ms) as a run
    on the bench's clock, which began at ``wall0_s``; None when it did not finish."""
    if "finished" not in timing or "run_ms" not in timing:
        return None
    end = (float(timing["finished"]) - wall0_s) * 1000.0 / time_scale
    return TaskRun(end - float(timing["run_ms"]), end, batch)


def task_runs(handles: Iterable[tuple[JobOutcome, Any]], wall0_s: float,
              time_scale: float) -> list[TaskRun]:
    """Every finished task's run, from the jobs' timing records (one pipelined round trip
    per thousand jobs): warm-up, shed and failed jobs included, since their tasks used
    the GPUs too. A record already gone gives nothing."""
    pairs = list(handles)
    runs: list[TaskRun] = []
    for i in range(0, len(pairs), 1000):
        chunk = pairs[i:i + 1000]
        try:
            pipe = chunk[0][1].client.pipeline(transaction=False)
            for _, handle in chunk:
                pipe.hvals(handle.keys.info)
            rows = pipe.execute()
        except Exception:  # Redis gone (a fault run): no runs to count
            continue
        for (outcome, _), values in zip(chunk, rows, strict=True):
            for value in values:
                run = run_of(json.loads(value), wall0_s, time_scale,
                             outcome.deadline_ms is None)
                if run is not None:
                    runs.append(run)
    return runs


def expiring_dag(dag_cls: type, deadline_ms: Callable[[str], float | None]) -> type:
    """A Dag class whose nodes carry Celery's own ``expires`` at the job's arrival plus
    its deadline (``deadline_ms(template)``): the ``celery-expires`` baseline. Each node's
    record gets that due time and no planned tail, so its message expires then, a
    worker drops it unrun if it starts later, and the job fails as a missed deadline."""

    class ExpiringDag(dag_cls):  # type: ignore[misc, valid-type]
        def records(self, spec: Any, priority: Any = None) -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = super().records(spec, priority)
            ms = deadline_ms(self.name)
            if ms is None:
                return out
            due = time.time() + ms * self.app.compass.settings.time_scale / 1000.0
            for node in out.values():
                node["due"], node["tail_ms"] = due, 0.0
            return out

    return ExpiringDag


def slo_table(result: dict[str, Any]) -> str:
    """One row per policy and SLO class of a benchmark result, with its model loads per
    job ('' when no job had a class)."""
    return stats_slo_table(result, ["loads/job"], lambda r: [r.get("loads_per_job", "-")])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: Row labels of docs/BENCHMARKS.md's SLO tables: (file suffix, policy) -> label.
SLO_ROWS = {("on", "compass"): "compass, admission on",
            ("off", "compass"): "compass, admission off",
            ("on", "jsq"): "jsq, admission on",
            ("off", "jsq"): "jsq, admission off",
            ("on", "celery-expires"): "celery-default + `expires=` deadline"}


def markdown_tables(results_dir: str, stem: str = "edge-vision") -> str:
    """docs/BENCHMARKS.md's tables, one per rate, from ``STEM-RATE-{on,off}.json``."""
    from pathlib import Path

    runs: dict[float, dict[str, Any]] = {}
    for path in sorted(Path(results_dir).glob(f"{stem}-*-o*.json")):
        rate, adm = path.stem.rsplit("-", 2)[1:]  # STEM-RATE-on / STEM-RATE-off
        runs.setdefault(float(rate), {})[adm] = json.loads(path.read_text())
    out = []
    head = ("| policy | admitted | rejected | shed | attainment | admitted attainment "
            "| goodput (jobs/s) | mean ms | p99 ms | loads per job | rejection p99 ms |")
    for rate in sorted(runs):
        out += [f"\n{rate:g} jobs/s:\n", head, "|" + " --- |" * 11]
        rows = [(label, runs[rate].get(adm, {}).get("policies", {}).get(policy))
                for (adm, policy), label in SLO_ROWS.items()]
        # further compass runs at this rate: PREFIX-STEM-RATE-on.json (a repeat, a headroom)
        for path in sorted(Path(results_dir).glob(f"*-{stem}-{rate:g}-on.json")):
            extra = json.loads(path.read_text())["policies"].get("compass")
            rows.append((f"compass, admission on ({path.stem.split(f'-{stem}')[0]})", extra))
        for label, r in rows:
            if r is None or "slo" not in r:
                continue
            s = r["slo"]["all"]
            rej = f"{s['rejection_ms']['p99']:.2f}" if s["rejected"] else "-"
            out.append(f"| {label} | {s['admitted']} | {s['rejected']} | {s['shed']} "
                       f"| {s['attainment']:.1%} | {s['admitted_attainment']:.1%} "
                       f"| {s['goodput_jobs_per_s']:.2f} | {s['latency_ms']['mean']:.1f} "
                       f"| {s['latency_ms']['p99']:.1f} | {r['loads_per_job']:.3f} | {rej} |")
    return "\n".join(out)
