"""Benchmark experiments built from single runs: the side-by-side table, a rate sweep,
and the paper's "half the servers" experiment (smallest cluster meeting a p99 SLO)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..workload import Workload
from .runner import BenchOptions, run_bench


def run_suite(workload: Workload, opts: BenchOptions, *, sweep: Sequence[float] = (),
              slo_ms: float | None = None, echo: Callable[[str], Any] = print
              ) -> dict[str, Any]:
    """One side-by-side run of the policies, plus the rate sweep and the SLO search if asked."""
    result = run_bench(workload, opts, echo)
    if sweep:
        result["sweep"] = rate_sweep(workload, opts, sweep, echo)
    if slo_ms is not None:
        result["min_workers"] = min_workers(workload, opts, slo_ms, echo)
    return result


def rate_sweep(workload: Workload, opts: BenchOptions, rates: Sequence[float],
               echo: Callable[[str], Any]) -> dict[str, list[dict[str, float]]]:
    """Mean and p99 latency per policy at each arrival rate."""
    out: dict[str, list[dict[str, float]]] = {p: [] for p in opts.policies}
    for rate in rates:
        echo(f"sweep: rate {rate}/s")
        run = run_bench(workload, replace(opts, rate=rate), echo)
        for policy, r in run["policies"].items():
            out[policy].append({"rate_per_s": rate, "mean": r["latency_ms"]["mean"],
                                "p99": r["latency_ms"]["p99"], "lost": r["lost"]})
    return out


def min_workers(workload: Workload, opts: BenchOptions, slo_ms: float,
                echo: Callable[[str], Any]) -> dict[str, dict[str, Any]]:
    """Per policy, the fewest workers (1 .. the workload's count) with p99 <= ``slo_ms``."""
    most = opts.workers or len(workload.cluster.workers)
    out: dict[str, dict[str, Any]] = {}
    for policy in opts.policies:
        tried: dict[int, float] = {}
        found = None
        for n in range(1, most + 1):
            echo(f"min-workers: {policy} with {n} worker(s)")
            run = run_bench(workload, replace(opts, policies=[policy], workers=n), echo)
            r = run["policies"][policy]
            tried[n] = r["latency_ms"]["p99"]
            if r["lost"] == 0 and r["failed"] == 0 and tried[n] <= slo_ms:
                found = n
                break
        out[policy] = {"slo_ms": slo_ms, "workers": found, "p99_by_workers": tried}
    return out


#: The fault runs of docs/run_benchmarks.sh, in table order: file stem -> row label.
FAULT_ROWS = {
    "rolling-restart": "rolling restart of every worker (SIGTERM, same name) from 5 s",
    "kill-worker": "SIGKILL one worker at 10 s",
    "kill-restart": "SIGKILL a random worker 50 times from 3 s, same-name restart (1,200 jobs)",
    "restart-redis-aof": "restart Redis at 10 s, AOF on",
    "restart-redis-no-aof": "restart Redis at 10 s, no persistence",
    "pause-redis": "Redis paused (SIGSTOP) at 10 s for 6 s",
    "clock-skew": "one worker's clock 30 s ahead",
    "long-task": "one 20 s task, visibility timeout 10 s (+1 job)",
}


def fault_table(results: dict[str, dict[str, Any]]) -> str:
    """The Markdown fault table of docs/BENCHMARKS.md from ``{stem: bench JSON}``,
    so the published numbers are the measured ones, copied by no hand."""
    lines = ["| fault | policy | jobs | completed | failed (clear error) | lost | duplicates "
             "| stranded | p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for stem, label in FAULT_ROWS.items():
        if stem not in results:
            continue
        for policy, r in results[stem]["policies"].items():
            name = f"**{policy}**" if policy == "compass" else policy
            lines.append(f"| {label} | {name} | {r['jobs']} | {r['completed']} | "
                         f"{r['failed']} | {r['lost']} | {r.get('duplicates', '-')} | "
                         f"{r.get('stranded', '-')} | {r['latency_ms']['p99']:.0f} |")
    return "\n".join(lines)
