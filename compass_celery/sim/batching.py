"""Batching in the simulator, measured: what each way of running batchable tasks sustains.

``compass-celery sim batching --workload dags/batch-embed.json`` sweeps the
request rate for four variants and prints, per variant, the highest rate whose p99
latency stays within the SLO, then per rate the p99, goodput, batch sizes and the
latency that holding batches open added. The variants:

- ``compass+batch``: workers batch and publish their forming batches; compass places
  each task where it finishes first, joining a forming batch included (``planner.batch``);
- ``compass+blind``: workers batch on their own; compass places as today (full run time
  per queued task, no forming batches);
- ``compass``: no batching;
- ``celery-default``: one shared queue, prefetch one: nothing to batch with.

The same seeded job stream per rate for every variant, workers warm (the model resident
everywhere), admission off: every job runs, so the p99 is of all of them.

With ``--deadline-ms D``, every job carries a deadline of D ms and admission is on: a job
whose plan misses it is refused at once. The measure is then goodput, the jobs answered
within the deadline per second, and each variant's peak over the rates swept. There,
placement's view of batches decides what is admitted too: a planner blind to them
charges every queued input a whole run, predicts waits a batch would not make, and
refuses jobs that would have met their deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..tables import text_table
from ..workload import Workload
from .runner import simulate

#: name -> (policy, batching)
VARIANTS: dict[str, tuple[str, str]] = {
    "compass+batch": ("compass", "on"),
    "compass+blind": ("compass", "blind"),
    "compass": ("compass", "off"),
    "celery-default": ("celery-default", "off"),
}


#: The SLO class :func:`with_deadline` gives a template the workload left without one.
REQUEST_CLASS = "request"


def with_deadline(workload: Workload, deadline_ms: float | None) -> Workload:
    """``workload`` with every job under one deadline that admission enforces: a job whose
    plan misses it is refused at once (``on_miss`` reject); None: ``workload`` as it is."""
    if deadline_ms is None:
        return workload
    dag_slo = {t: workload.dag_slo.get(t, REQUEST_CLASS) for t in workload.dags}
    body = {"deadline_ms": float(deadline_ms), "on_miss": "reject"}
    classes = {**workload.slo_classes, **{c: dict(body) for c in set(dag_slo.values())}}
    return replace(workload, slo_classes=classes, dag_slo=dag_slo)


def run_variant(workload: Workload, variant: str, rate: float, *, jobs: int | None = None,
                admission: bool = False) -> dict[str, Any]:
    """One variant at one rate: the simulator's per-policy record."""
    policy, batching = VARIANTS[variant]
    return simulate(workload, [policy], rate=rate, jobs=jobs, warm=True, admission=admission,
                    batching=batching)["policies"][policy]


def row(record: dict[str, Any]) -> dict[str, Any]:
    """The numbers the tables show from one record."""
    slo = (record.get("slo") or {}).get("all", {})
    b = record.get("batching") or {}
    return {"p50": record["latency_ms"]["p50"], "p99": record["latency_ms"]["p99"],
            "goodput": slo.get("goodput_jobs_per_s", float("nan")),
            "attain": slo.get("attainment", float("nan")),
            "rejected": slo.get("rejected", 0),
            "size_mean": b.get("size", {}).get("mean", 1.0),
            "size_p99": b.get("size", {}).get("p99", 1.0),
            "sizes": b.get("sizes", {}),
            "held_share": b.get("held_share", 0.0),
            "hold_p99": b.get("task_hold_ms", {}).get("p99", 0.0),
            "hold_max": b.get("task_hold_ms", {}).get("max", 0.0)}


def sustained(workload: Workload, variant: str, slo_ms: float, lo: float, hi: float, *,
              jobs: int | None = None, step: float = 10.0) -> float:
    """The highest rate (to ``step`` jobs/s) in [lo, hi] with p99 within ``slo_ms``, by
    bisection (0 when even ``lo`` misses it)."""
    if run_variant(workload, variant, lo, jobs=jobs)["latency_ms"]["p99"] > slo_ms:
        return 0.0
    if run_variant(workload, variant, hi, jobs=jobs)["latency_ms"]["p99"] <= slo_ms:
        return hi
    while hi - lo > step:
        mid = (lo + hi) / 2
        if run_variant(workload, variant, mid, jobs=jobs)["latency_ms"]["p99"] <= slo_ms:
            lo = mid
        else:
            hi = mid
    return lo


def sweep(workload: Workload, rates: Sequence[float], slo_ms: float, *,
          variants: Sequence[str] = tuple(VARIANTS), jobs: int | None = None,
          deadline_ms: float | None = None) -> dict[str, Any]:
    """Every variant at every rate, and each variant's sustained rate within ``slo_ms``;
    with ``deadline_ms``, admission on and each variant's peak goodput instead."""
    admission, workload = deadline_ms is not None, with_deadline(workload, deadline_ms)
    out: dict[str, Any] = {"workload": workload.name, "slo_p99_ms": slo_ms, "rates": {},
                           "sustained": {}, "deadline_ms": deadline_ms}
    for v in variants:
        out["rates"][v] = {str(r): row(run_variant(workload, v, r, jobs=jobs,
                                                   admission=admission)) for r in rates}
        if admission:
            out.setdefault("peak_goodput", {})[v] = peak_goodput(out["rates"][v])
        else:
            out["sustained"][v] = sustained(workload, v, slo_ms, min(rates), max(rates),
                                            jobs=jobs)
    return out


def peak_goodput(by_rate: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The most jobs a second a variant answered within their deadline, and at what rate."""
    rate, r = max(by_rate.items(), key=lambda kv: kv[1]["goodput"])
    return {"goodput": float(r["goodput"]), "rate": float(rate)}


def tables(result: dict[str, Any]) -> str:
    """The sweep as text: sustained rate (or peak goodput) per variant, then per rate
    and variant."""
    if result.get("peak_goodput"):
        head = text_table([[v, f"{p['goodput']:.1f}", f"{p['rate']:g}"]
                           for v, p in result["peak_goodput"].items()],
                          ["variant", f"peak goodput/s (deadline {result['deadline_ms']:g} "
                           "ms, admission on)", "at rate/s"])
    else:
        head = text_table([[v, f"{r:.0f}"] for v, r in result["sustained"].items()],
                          ["variant", f"jobs/s within p99 <= {result['slo_p99_ms']:g} ms"])
    rows = []
    for v, by_rate in result["rates"].items():
        for rate, r in by_rate.items():
            sizes = " ".join(f"{k}:{n}" for k, n in r["sizes"].items()) or "-"
            rows.append([v, rate, f"{r['p50']:.1f}", f"{r['p99']:.1f}", f"{r['goodput']:.1f}",
                         f"{r['attain']:.3f}", r.get("rejected", 0), f"{r['size_mean']:.2f}",
                         f"{r['size_p99']:.0f}", f"{r['hold_p99']:.2f}",
                         f"{r['hold_max']:.2f}", sizes])
    body = text_table(rows, ["variant", "rate/s", "p50 ms", "p99 ms", "goodput/s", "attain",
                             "refused", "batch mean", "batch p99", "hold p99", "hold max",
                             "sizes"])
    return head + "\n\n" + body
