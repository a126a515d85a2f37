"""Batching on the real cluster: what each way of running batchable tasks sustains.

``compass-celery bench batching`` runs the simulator's batching comparison
(``sim.batching``) on real Redis-backed Celery workers: emulated GPUs by default, real
forward passes on the CPU with ``--real``. For each rate, the same seeded arrivals go to
a fresh cluster per variant:

- ``compass+batch``: workers batch (``compass_batching``) and placement counts the
  batches forming in their queues (``compass_batch_aware``);
- ``compass+blind``: workers batch on their own, placement blind to it;
- ``compass``: no batching (every input runs as a batch of one);
- ``celery-default``: one shared queue, no batching.

Workers start warm (the batched nodes' models preloaded, as the simulator's
workers are) and admission is off, so every job runs and the p99 is of all of them;
with ``--deadline-ms D`` every job carries a D ms deadline and admission is on, and the
measure is goodput (``sim.batching``). It prints, per
variant, the highest rate of the sweep whose p99 stays within ``--slo-ms`` (every lower
rate too), then per rate: p50 and p99, goodput (jobs within their deadline per second),
batch sizes and the latency that forming batches added, in the simulator's table; with
``--compare-sim``, the simulator's numbers for the same workload, rates and job count.
Latencies are workload ms (real ms over ``--time-scale``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..local import LocalRedisError, RedisServer
from ..sim.batching import VARIANTS as SIM_VARIANTS
from ..sim.batching import peak_goodput, row, run_variant, with_deadline
from ..tables import text_table
from ..workload import Workload
from .options import BenchOptions
from .runner import run_policy

#: name -> (benchmark policy, workers batch, placement counts forming batches); the
#: simulator's variants, by the same names.
VARIANTS: dict[str, tuple[str, bool, bool]] = {
    "compass+batch": ("compass", True, True),
    "compass+blind": ("compass", True, False),
    "compass": ("compass", False, True),
    "celery-default": ("celery-default", False, False),
}
assert list(VARIANTS) == list(SIM_VARIANTS)

#: Emulated: each workload ms sleeps 5 real ms. batch-embed's four GPUs then run at most
#: ~42 unbatched passes a second (18.9 ms x 5 each): the sleeps, not the Python around
#: them, are what saturates, on two cores shared by the workers, Redis and the sender.
EMULATED_SCALE = 5.0
DEFAULTS = {False: ("dags/batch-embed.json", "100,200,300,400,500", EMULATED_SCALE),
            True: ("dags/embed-real.json", "40,80,120,160,200,240", 1.0)}


def options_for(base: BenchOptions, variant: str, rate: float, admission: bool = False
                ) -> BenchOptions:
    """``base`` for one variant at one rate (admission off: every job runs)."""
    policy, batching, aware = VARIANTS[variant]
    return replace(base, policies=[policy], rate=rate, batching=batching,
                   batch_aware=aware, admission=admission)


def warm(base: BenchOptions, workload: Workload) -> BenchOptions:
    """``base`` with every worker loading the models of the workload's batched nodes at
    start (``COMPASS_PRELOAD``): the sweep measures batching, not a cold start."""
    models = sorted({t.model for d in workload.dags.values() for t in d.nodes.values()
                     if t.batch is not None and t.model})
    return replace(base, extra_env={**base.extra_env, "COMPASS_PRELOAD": ",".join(models)})


def sweep(workload: Workload, rates: Sequence[float], slo_ms: float, base: BenchOptions,
          *, variants: Sequence[str] = tuple(VARIANTS), echo: Callable[[str], Any] = print,
          deadline_ms: float | None = None) -> dict[str, Any]:
    """Every variant at every rate on fresh clusters over one private Redis (rate by rate,
    so that a slow spell of a shared machine falls on every variant alike); with
    ``deadline_ms``, every job under that deadline and admission on."""
    admission, workload = deadline_ms is not None, with_deadline(workload, deadline_ms)
    out: dict[str, Any] = {"workload": workload.name, "slo_p99_ms": slo_ms,
                           "time_scale": base.time_scale, "real": base.real,
                           "jobs": base.jobs, "rates": {v: {} for v in variants},
                           "runs": {v: {} for v in variants}, "sustained": {},
                           "deadline_ms": deadline_ms}
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(RedisServer()).url
        try:  # the execution ledger apart, as the benchmark keeps it
            ledger_url = stack.enter_context(RedisServer()).url
        except LocalRedisError:
            ledger_url = url
        for rate in rates:
            for v in variants:
                echo(f"{v} at {rate:g} jobs/s")
                opts = options_for(base, v, rate, admission)
                record = run_policy(workload, opts.policies[0], url, opts, echo,
                                    ledger_url=ledger_url)
                out["rates"][v][str(rate)] = r = row(record)
                out["runs"][v][str(rate)] = run = run_summary(record)
                echo(f"  p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, batch mean "
                     f"{r['size_mean']:.2f}, done {run['completed']}/{run['jobs']}")
    return headline(out, slo_ms, admission)


def run_summary(record: dict[str, Any]) -> dict[str, Any]:
    """What one run delivered: jobs, done, lost, duplicates, stranded, batched passes."""
    return {k: record.get(k) for k in ("jobs", "completed", "failed", "lost", "duplicates",
                                       "stranded", "throughput_jobs_per_s")} | {
        "passes": (record.get("batching") or {}).get("passes", 0),
        "inputs": (record.get("batching") or {}).get("inputs", 0)}


def headline(out: dict[str, Any], slo_ms: float, admission: bool) -> dict[str, Any]:
    """``out`` with each variant's headline from its rows: the peak goodput under
    admission, else the highest rate sustained within ``slo_ms``."""
    for v, by_rate in out["rates"].items():
        if admission:
            out.setdefault("peak_goodput", {})[v] = peak_goodput(by_rate)
        else:
            out["sustained"][v] = sustained(by_rate, slo_ms)
    return out


def sustained(by_rate: dict[str, dict[str, Any]], slo_ms: float) -> float:
    """The highest rate of a sweep whose p99 is within ``slo_ms``, every lower rate's
    too (0 when the lowest misses it)."""
    best = 0.0
    for rate in sorted(by_rate, key=float):
        if not by_rate[rate]["p99"] <= slo_ms:
            break
        best = float(rate)
    return best


def simulated(workload: Workload, rates: Sequence[float], slo_ms: float,
              variants: Sequence[str], jobs: int | None, deadline_ms: float | None = None
              ) -> dict[str, Any]:
    """The simulator's numbers for the same workload, rates, job count and deadline."""
    admission, workload = deadline_ms is not None, with_deadline(workload, deadline_ms)
    out: dict[str, Any] = {"workload": workload.name, "slo_p99_ms": slo_ms, "rates": {},
                           "sustained": {}, "deadline_ms": deadline_ms}
    for v in variants:
        out["rates"][v] = {str(r): row(run_variant(workload, v, r, jobs=jobs,
                                                   admission=admission)) for r in rates}
    return headline(out, slo_ms, admission)


def runs_table(result: dict[str, Any]) -> str:
    """What each run delivered, so a table row is never read off a run that lost jobs."""
    rows = [[v, rate, r["jobs"], r["completed"], r["lost"], r["duplicates"], r["stranded"],
             r["passes"], r["inputs"]]
            for v, by_rate in result["runs"].items() for rate, r in by_rate.items()]
    return text_table(rows, ["variant", "rate/s", "jobs", "done", "lost", "dup", "stranded",
                             "passes", "inputs"])
