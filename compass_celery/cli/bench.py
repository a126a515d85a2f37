"""``compass-celery bench``: every benchmark, one subcommand each.

``bench cluster`` is the real-cluster benchmark (``bench --workload W`` runs it too); the
others measure one thing each: the hot path's overhead, planning time, many producers,
a batch flood, a long soak, batching on real workers; ``fault-table`` and ``slo-table``
print the Markdown tables of saved runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from .cluster import cluster
from .common import load, names, positive_floats, write_json
from .groups import DefaultGroup


@click.group(cls=DefaultGroup, default="cluster",
             help="Benchmarks: the real cluster (bench cluster; options given straight to "
             "bench go to it), the hot path's overhead, planning time, many producers, a "
             "batch flood, a long soak, batching, and the tables of saved runs.")
def bench() -> None:
    """The ``bench`` group; ``bench --workload W`` is ``bench cluster --workload W``."""


bench.add_command(cluster)


@bench.command(help="What compass costs on the hot path against plain Celery, on a private "
               "Redis with two emulated workers: one placement decision at 4 and 64 "
               "workers' records (cached and fresh snapshot, µs), enqueue latency of a "
               "compass-routed task against a plain one (µs), and a 3-task no-op Dag "
               "against Celery's chain (ms), with the CPU each costs.")
def overhead() -> None:
    """Run the overhead measurements and print them."""
    from ..bench.overhead import run

    os.environ.setdefault("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    run(echo=click.echo)


@bench.command(name="fetch-ab",
               help="The hot path with the atomic fetch (compass_atomic_fetch) on and off, "
               "alternated on a private Redis with two emulated workers each: a 3-task "
               "no-op Dag and Celery's chain, p50 and p99 per round and side (ms).")
@click.option("--rounds", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--jobs", type=click.IntRange(min=1), default=40, show_default=True,
              help="timed jobs per kind, side and round")
def fetch_ab(rounds: int, jobs: int) -> None:
    """Alternate the atomic fetch on and off and print the table."""
    from ..bench.fetch_ab import run

    run(rounds, jobs, echo=click.echo)


@bench.command(name="plan-timing",
               help="How long planning takes: one task and a 10-task DAG on synthetic, "
               "seeded workers at each worker count; median and p99 of the policy's plan "
               "call in µs, per snapshot kind (cold: columns rebuilt in the call; live: "
               "handed over ready; warm: memoised). Pure CPU, no Redis.")
@click.option("--workers", "worker_counts", default="4,64,1000", show_default=True,
              help="comma-separated worker counts")
@click.option("--policies", default="compass", show_default=True,
              help="comma-separated policy names")
@click.option("--snapshots", default="cold,warm", show_default=True,
              help="cases among cold, live, warm")
@click.option("--reps", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def plan_timing(worker_counts: str, policies: str, snapshots: str, reps: int,
                seed: int) -> None:
    """Time the plans and print one row per worker count, case, snapshot and policy."""
    from ..bench.plan_timing import SNAPSHOTS, run
    from ..planner import POLICIES

    counts = [int(n) for n in positive_floats(worker_counts, "--workers")]
    run(counts, names(policies, (), tuple(POLICIES)),
        names(snapshots, (), SNAPSHOTS, what="snapshot kind", hint="--snapshots"),
        reps, seed, echo=click.echo)


@bench.command(help="Many producer processes routing against one Redis: decisions per "
               "second, the time of each state read and of the decisions that waited for "
               "one, how old the state each decision planned on was, and Redis's egress "
               "and CPU (a private redis-server; GPU times emulated, no tasks run).")
@click.option("--records", type=click.IntRange(min=1), default=1000, show_default=True,
              help="worker records published")
@click.option("--producers", type=click.IntRange(min=1), default=32, show_default=True,
              help="routing processes")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="measured window")
@click.option("--changing", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="fraction of workers whose record changes on every publish")
@click.option("--interval", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="seconds between one producer's decisions (0: as fast as it can), as "
              "in a web process between requests")
@click.option("--refresh-ahead", type=click.FloatRange(min=0), default=None,
              help="seconds past the TTL a snapshot is served while read ahead (default: "
              "compass_snapshot_refresh_ahead_s; 0: decisions wait for reads, and nothing "
              "is kept fresh unless --keep-fresh says so)")
@click.option("--keep-fresh", type=click.FloatRange(min=0), default=None,
              help="seconds after a decision the snapshot is kept fresh in the background "
              "(default: compass_snapshot_keep_fresh_s; 0: a producer idle past the "
              "read-ahead reads before it decides)")
@click.option("--drift", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="fraction of backlog reconciles that find the counter drifted")
@click.option("--json", "json_out", default=None, help="also write the result here")
def producers(records: int, producers: int, seconds: float, changing: float,
              interval: float, refresh_ahead: float | None, keep_fresh: float | None,
              drift: float, json_out: str | None) -> None:
    """Run one measurement and print its report."""
    from ..bench.producers import report, run

    result = run(records, producers, seconds, changing, ahead=refresh_ahead, drift=drift,
                 interval_s=interval, keep_fresh=keep_fresh)
    click.echo(report(result))
    write_json(result, json_out)


@bench.command(help="Interactive work under a batch flood, on real workers (emulated GPUs) "
               "and a private Redis: interactive task and two-node job latency, p50 and "
               "p99, against the bound of their own run plus one batch task in flight, "
               "and the share of the capacity left that batch work still gets. Exits 1 "
               "when a bound is missed.")
@click.option("--broker", "brokers", multiple=True,
              help="broker URL, or 'redis' for the private Redis the run starts (repeat "
              "for several; default: the private Redis)")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True)
@click.option("--batch-ms", type=click.FloatRange(min=0), default=500.0, show_default=True)
@click.option("--click-ms", type=click.FloatRange(min=0), default=50.0, show_default=True)
@click.option("--clicks-per-s", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True)
@click.option("--json", "json_out", default=None, help="write the results here")
def flood(brokers: tuple[str, ...], workers: int, seconds: float, batch_ms: float,
          click_ms: float, clicks_per_s: float, json_out: str | None) -> None:
    """Run the flood on each broker given, print the table."""
    from ..bench.flood import run, table

    results = [run(b, workers, seconds, batch_ms, click_ms, clicks_per_s)
               for b in (brokers or [None])]
    click.echo(table(results))
    write_json(results, json_out)
    sys.exit(0 if all(r["task"]["met"] and r["job"]["met"] and r["batch"]["met"]
                      for r in results) else 1)


@bench.command(help="A long soak under a steady stream of Dag jobs: Redis's key count and "
               "used memory and each worker's RSS, sampled, and whether each level stays "
               "flat after the fill time (a private Redis with AOF, real emulated-GPU "
               "workers). Exits 1 unless every level is flat.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="how long jobs are submitted")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="jobs submitted per second")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--job-ttl-s", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="compass_job_ttl_s of the workers and the producer")
@click.option("--restart-redis-at-s", type=click.FloatRange(min=0), default=None,
              help="restart Redis (SIGTERM, AOF kept) this many seconds in")
@click.option("--sample-s", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True)
@click.option("--drain-s", type=click.FloatRange(min=0), default=None,
              help="sampling after the last job is submitted (default: the fill time, "
              "max(TTL, once-guard expiry), + 10 s)")
@click.option("--json", "json_out", default=None, help="write the samples and the verdict here")
def soak(minutes: float, rate: float, workers: int, job_ttl_s: float,
         restart_redis_at_s: float | None, sample_s: float, drain_s: float | None,
         json_out: str | None) -> None:
    """Run one soak, print the table and the verdict."""
    from ..bench.soak import SoakOptions, flat, run, summary

    result = run(SoakOptions(minutes, rate, workers, job_ttl_s, restart_redis_at_s,
                             sample_s, drain_s))
    click.echo(summary(result))
    write_json(result, json_out, indent=1)
    sys.exit(0 if flat(result) else 1)


@bench.command(help="Batching on real workers (emulated GPUs, or real forward passes on "
               "the CPU with --real): per variant (compass+batch, compass+blind, compass, "
               "celery-default), the highest rate whose p99 stays within --slo-ms, then per "
               "rate p50/p99, goodput, batch sizes and the latency held batches added; "
               "with --compare-sim, the simulator's numbers beside them.")
@click.option("--workload", "workload_path", default=None,
              help="default dags/batch-embed.json, with --real dags/embed-real.json")
@click.option("--rates", default=None, help="jobs/s, comma-separated (default "
              "100,200,300,400,500; with --real 40,80,120,160,200,240)")
@click.option("--slo-ms", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="p99 latency target, ms")
@click.option("--jobs", type=click.IntRange(min=1), default=400, show_default=True,
              help="jobs per run")
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=None,
              help="real ms per workload ms (default 5; 1 with --real)")
@click.option("--variants", default=None, help="comma-separated (default: all four)")
@click.option("--deadline-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="every job under this deadline, admission on: report goodput "
              "(default: admission off, p99)")
@click.option("--real", is_flag=True,
              help="real forward passes on the CPU instead of emulated GPUs")
@click.option("--compare-sim", is_flag=True,
              help="also print the simulator's numbers for the same rates")
@click.option("--json", "json_out", default=None, help="write the result object here")
def batching(workload_path: str | None, rates: str | None, slo_ms: float, jobs: int,
             time_scale: float | None, variants: str | None, deadline_ms: float | None,
             real: bool, compare_sim: bool, json_out: str | None) -> None:
    """Sweep the rates on real workers and print the tables."""
    from ..bench.batching import DEFAULTS, VARIANTS, runs_table, simulated, sweep, warm
    from ..bench.options import BenchOptions
    from ..sim.batching import tables

    path, rates_default, scale = DEFAULTS[real]
    chosen = names(variants, tuple(VARIANTS), tuple(VARIANTS), "variant", "--variants")
    swept = positive_floats(rates or rates_default, "--rates")
    scale = time_scale if time_scale is not None else scale
    workload = load(workload_path or path)
    base = warm(BenchOptions(jobs=jobs, time_scale=scale, real=real, progress=False),
                workload)
    result = sweep(workload, swept, slo_ms, base, variants=chosen,
                   echo=lambda m: click.echo(m, err=True), deadline_ms=deadline_ms)
    if compare_sim:
        result["simulated"] = simulated(workload, swept, slo_ms, chosen, jobs, deadline_ms)
    write_json(result, json_out)
    kind = "real compute (CPU)" if real else f"emulated GPUs, time scale {scale:g}"
    click.echo(f"{workload.name} on real workers, {kind}; {jobs} jobs per run\n")
    click.echo(tables(result) + "\n\n" + runs_table(result))
    if compare_sim:
        click.echo("\nsimulated, the same workload, rates and jobs\n")
        click.echo(tables(result["simulated"]))


@bench.command(name="fault-table",
               help="The Markdown table of the fault runs saved as DIR/fault-*.json (by "
               "docs/run_benchmarks.sh faults): per fault and policy, jobs, completed, "
               "failed, lost, duplicated, stranded and p99.")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
def fault_table(folder: str) -> None:
    """Print the fault table."""
    import json
    from pathlib import Path

    from ..bench.suite import FAULT_ROWS
    from ..bench.suite import fault_table as table

    here = Path(folder)
    results = {stem: json.loads((here / f"fault-{stem}.json").read_text())
               for stem in FAULT_ROWS if (here / f"fault-{stem}.json").exists()}
    click.echo(table(results))


@bench.command(name="trace-waits",
               help="Where urgent successors waited, from the trace lines workers write "
               "when COMPASS_TRACE_DIR is set: each one's wait, the age of the snapshot its "
               "placement read, and what ran on its worker meanwhile, by kind.")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--time-scale", type=click.FloatRange(min=0.01), default=1.0,
              show_default=True, help="the run's time scale (times shown in workload ms)")
@click.option("--level", type=click.IntRange(0, 9), default=9, show_default=True,
              help="the priority level of the successors followed")
@click.option("--hops", is_flag=True,
              help="also what every hop cost: each successor's release after its "
              "sender's end, a busy worker's gap between tasks, an idle worker's pick")
def trace_waits(folder: str, time_scale: float, level: int, hops: bool) -> None:
    """Print the wait report."""
    from ..bench.trace_waits import hops_report, load, report

    lines = load(folder)
    click.echo(report(lines, time_scale, level))
    if hops:
        click.echo(hops_report(lines, time_scale))


@bench.command(name="slo-table",
               help="The Markdown tables of the SLO runs saved in DIR (by "
               "docs/run_benchmarks.sh slo): per rate and policy, admitted, rejected, "
               "shed, attainment, goodput, latency and loads per job.")
@click.argument("folder", type=click.Path(exists=True, file_okay=False),
                default="docs/results/slo")
def slo_table(folder: str) -> None:
    """Print the SLO tables."""
    from ..bench.slo import markdown_tables

    click.echo(markdown_tables(folder))


@bench.command(name="realsim-table",
               help="The criterion the simulator meets against the real cluster, per "
               "workload and time scale over the runs saved in DIR by bench cluster "
               "--compare-sim (three or more reruns on fresh arrivals each): the real "
               "mean pooled over the reruns within the pooled simulated means' range over "
               "the draws, and the loads after warm-up within 1.3x or 0.5% of the tasks. "
               "Exits 1 when one fails.")
@click.argument("folder", type=click.Path(exists=True, file_okay=False),
                default="docs/results/realsim")
@click.option("--workloads", "workloads_dir", type=click.Path(exists=True, file_okay=False),
              default="dags", show_default=True,
              help="where the runs' workload files are (found by name)")
@click.option("--resimulate", is_flag=True,
              help="make the drawn simulations again on this simulator from what each run "
              "measured, instead of reading the saved ones")
@click.option("--no-delays", is_flag=True,
              help="with --resimulate: without the measured delays of sends and answers")
@click.option("--draws", "draws_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="simulated draws made elsewhere (JSON: run name -> "
              "variant -> draw_means_ms and draw_loads), e.g. on the simulator that made "
              "the runs; they replace the saved ones")
@click.option("--variant", default=None, help="with --draws: which variant")
@click.option("--json", "json_out", default=None,
              help="write each group's verdict and each run's simulated spread here")
def realsim_table(folder: str, workloads_dir: str, resimulate: bool, no_delays: bool,
                  draws_path: str | None, variant: str | None, json_out: str | None) -> None:
    """Judge every group of reruns in FOLDER and print the table."""
    import json
    from dataclasses import asdict
    from pathlib import Path

    from ..bench.realsim import MIN_RERUNS, judge, rerun_of, table
    from ..workload import WorkloadError, load_workload
    from .compare import resimulate as again

    known: dict[str, Any] = {}
    for path in sorted(Path(workloads_dir).glob("*.json")):
        try:
            w = load_workload(str(path))
        except WorkloadError:
            continue
        known.setdefault(w.name, w)
    if (draws_path is None) != (variant is None) or (draws_path and resimulate):
        raise click.UsageError("--draws takes --variant (and not --resimulate)")
    draws = json.loads(Path(draws_path).read_text()) if draws_path else {}
    groups: dict[tuple[str, float], list[Any]] = {}
    spreads: dict[str, Any] = {}
    for path in sorted(Path(folder).glob("*.json")):
        result = json.loads(path.read_text())
        if "simulated_drawn_spread" not in result:
            continue
        workload = known.get(result.get("workload", ""))
        if workload is None:
            raise click.ClickException(f"{path}: workload {result.get('workload')!r} is not "
                                       f"in {workloads_dir}")
        if resimulate:
            result["simulated_drawn_spread"] = again(result, workload, not no_delays)
            click.echo(f"  {path.name}: simulated again", err=True)
        elif draws:
            made = draws.get(path.stem, {}).get(variant)
            if made is None:
                raise click.ClickException(f"{draws_path}: no {variant!r} draws of {path.stem}")
            for s in result["simulated_drawn_spread"].values():
                s.update(made)
        spreads[path.stem] = result["simulated_drawn_spread"]
        sizes = {name: len(spec.nodes) for name, spec in workload.dags.items()}
        groups.setdefault((workload.name, float(result["time_scale"])), []).append(
            rerun_of(result, sizes))
    judged = [(name, scale, runs) for (name, scale), runs in sorted(groups.items())
              if len(runs) >= MIN_RERUNS]
    if not judged:
        raise click.ClickException(f"no workload in {folder} has {MIN_RERUNS} reruns or more")
    click.echo(table(judged))
    verdicts = {f"{name}@{scale:g}": asdict(judge(runs)) for name, scale, runs in judged}
    write_json({"verdicts": verdicts, "spreads": spreads}, json_out)
    sys.exit(0 if all(v["passed"] for v in verdicts.values()) else 1)
