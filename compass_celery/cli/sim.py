"""``compass-celery sim``: the planner in a discrete-event simulator, on any cluster size.

``sim run`` simulates the policies on a workload (``sim --workload W`` and the older
``simulate`` run it too); ``sim batching`` sweeps the ways of running batchable tasks;
``sim generate`` writes a many-model workload at a chosen load. ``sim run``'s flags that
the simulator models are gathered once into a
:class:`~compass_celery.sim.options.SimOptions`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from ..tables import result_table, text_table
from .common import SEED, load, names, positive_floats, write_json
from .groups import DefaultGroup

RUN_HELP = ("Discrete-event simulation of the same planner, cache and worker code on any "
            "cluster size: per policy, jobs done, failed and lost, latency (mean, p50, "
            "p95, p99), cache hit rate, model loads, throughput, the mean time per task "
            "(queued, load, hop, run) and planning wall time per job; with deadlines, "
            "the SLO outcomes per class.")


def _on(ctx: click.Context, param: click.Parameter, value: str) -> bool:
    return value == "on"


#: ``sim run``'s flags that become :class:`~compass_celery.sim.options.SimOptions` fields
#: (each flag's destination is the field's name).
SIM_FLAGS: list[Callable[[Any], Any]] = [
    click.option("--workers", type=click.IntRange(min=1), default=None,
                 help="scale the workload's cluster to this many workers"),
    click.option("--rate", type=click.FloatRange(min=1e-6), default=None,
                 help="jobs per second (default: the workload's)"),
    click.option("--jobs", type=click.IntRange(min=1), default=None,
                 help="job count (default: the workload's)"),
    click.option("--hop-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
                 help="modelled fixed dispatch overhead per task (broker and bookkeeping "
                 "round trips), workload ms, which workers publish and plans count, as "
                 "real ones learn theirs; calibrate it from a real bench run"),
    click.option("--hop-planned/--hop-unplanned", "plan_hop", default=True,
                 help="plans count the hop (the default), or leave it out, as before "
                 "workers learned theirs"),
    click.option("--refresh-ms", type=click.FloatRange(min=0), default=0.0,
                 show_default=True, help="snapshot staleness, ms"),
    click.option("--move-factor", type=click.FloatRange(min=0), default=None,
                 help="re-place a successor when its worker's backlog exceeds this times "
                 "its run time (compass_move_factor; default: its default)"),
    click.option("--demand/--no-demand", default=True,
                 help="plan with recent demand per model (eviction pricing), or without, "
                 "as a producer that does not track it"),
    click.option("--admission", type=click.Choice(["on", "off"]), default="on",
                 show_default=True, callback=_on,
                 help="refuse at arrival a job its plan says will miss its SLO deadline "
                 "(off: take it, marked late; it is still shed once behind)"),
    click.option("--max-queue-ms", type=click.FloatRange(min=0), default=None,
                 help="refuse any job with more than this much work queued ahead of it"),
    click.option("--hold-max-ms", type=click.FloatRange(min=0), default=None,
                 help="held slot: a worker starts no lower-level task while a higher "
                 "level's successor is planned on it, for at most this long per hold "
                 "(compass_hold_max_ms; default: its default; 0: off)"),
    click.option("--warm", is_flag=True,
                 help="start every worker with the models static-replicas would give it "
                 "resident (unpinned): a cluster that has been serving"),
    click.option("--batching", type=click.Choice(["on", "blind", "off"]), default="on",
                 show_default=True,
                 help="for nodes a workload marks batchable: workers batch and compass "
                 "places by their forming batches (on), workers batch but placement "
                 "ignores it (blind), or every task runs alone (off)"),
]


def _sim_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    for flag in reversed(SIM_FLAGS):
        command = flag(command)
    return command


@click.group(cls=DefaultGroup, default="run",
             help="The simulator: run the policies on a workload (sim run; options given "
             "straight to sim go to it), sweep batching, generate workloads.")
def sim() -> None:
    """The ``sim`` group; ``sim --workload W`` is ``sim run --workload W``."""


@sim.command(name="run", help=RUN_HELP)
@click.option("--workload", "workload_path", required=True,
              help="workload file (JSON/YAML) or a shipped workload's name")
@click.option("--policies", default=None,
              help="comma-separated subset (default: every real policy); static-replicas "
              "is a simulator-only reference: replicas sized from the workload, pinned; "
              "celery-expires is celery-default with each task dropped unrun once its "
              "job's deadline has passed (Celery's expires=)")
@SEED
@_sim_flags
@click.option("--compare-pending", is_flag=True,
              help="instead: compass with and without planned-not-sent work counted in "
              "its backlog")
@click.option("--table", is_flag=True, hidden=True,
              help="accepted for older command lines: the tables are always printed")
@click.option("--json", "json_out", default=None, help="write the result object here")
def run(workload_path: str, policies: str | None, seed: int | None, compare_pending: bool,
        table: bool, json_out: str | None, **flags: Any) -> None:
    """Simulate the policies on the workload; print the tables and write the JSON."""
    from ..bench.runner import POLICIES
    from ..planner import POLICIES as PLANNER_POLICIES
    from ..planner import VARIANTS
    from ..sim.options import SimOptions
    from ..sim.runner import SIM_ONLY_POLICIES, compare_count_pending, simulate

    for name in ("move_factor", "hold_max_ms"):
        if flags[name] is None:
            del flags[name]
    options = SimOptions(**flags)
    workload = load(workload_path, seed)
    if compare_pending:
        if options.batching != "on":
            raise click.UsageError("--batching applies to a policy run, not "
                                   "--compare-pending")
        pending = compare_count_pending(workload, options)
        result = {"policies": {f"count pending {k}": r
                               for k, r in pending["count_pending"].items()}}
        click.echo(f"{workload.name}: compass with planned-not-sent work in its backlog, "
                   "and without")
        click.echo(result_table(result))
        write_json(pending, json_out)
        return
    chosen = names(policies, POLICIES, (*PLANNER_POLICIES, *VARIANTS, *SIM_ONLY_POLICIES))
    result = simulate(workload, chosen, options)
    _print_run(workload, options, result)
    write_json(result, json_out)


def _print_run(workload: Any, options: Any, result: dict[str, Any]) -> None:
    """The result table, its SLO table when the workload has classes, and the mean time
    per task with the planning time."""
    from ..results import BATCH_SHARE_HEADING, batch_share_lines
    from ..sim.stats import slo_table

    hop = f", {options.hop_ms:g} ms modelled hop per task" if options.hop_ms else ""
    click.echo(f"{workload.name}: simulated, {options.workers or len(workload.cluster.workers)}"
               f" workers{hop}, latency in workload ms")
    click.echo(result_table(result))
    slos = slo_table(result)
    if slos:
        click.echo(f"\n{slos}")
    shares = batch_share_lines(result)
    if shares:
        click.echo(f"\n{BATCH_SHARE_HEADING}\n{shares}")
    rows = [[name, *(f"{r['breakdown_ms'][k]:.1f}" for k in
                     ("queued_ms", "load_ms", "hop_ms", "run_ms")),
             f"{r['plan_ms']['p50']:.3f}", f"{r['plan_ms']['p99']:.3f}"]
            for name, r in result["policies"].items()]
    click.echo("\nmean per task (ms), and planning wall time per job (ms)")
    click.echo(text_table(rows, ["policy", "queued", "load", "hop", "run", "plan p50",
                                 "plan p99"]))


#: ``compass-celery simulate``: ``sim run`` under its older name, kept for command lines
#: written before ``sim`` had subcommands (not listed in ``--help``).
simulate = click.Command("simulate", params=run.params, callback=run.callback,
                         help=RUN_HELP, hidden=True)


@sim.command(help="Batching in the simulator: per variant (compass+batch, compass+blind, "
             "compass, celery-default), the highest rate whose p99 latency stays within "
             "--slo-ms, then per rate the p99, goodput, batch sizes and the latency held "
             "batches added; with --deadline-ms, goodput under that deadline instead.")
@click.option("--workload", "workload_path", required=True,
              help="workload file or shipped name, e.g. batch-embed")
@click.option("--rates", default="50,100,200,300,400,500,600,700,800", show_default=True,
              help="jobs/s, comma-separated")
@click.option("--slo-ms", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="p99 latency target, ms")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="jobs per run (default: the workload's)")
@click.option("--deadline-ms", type=click.FloatRange(min=0, min_open=True), default=None,
              help="every job under this deadline, admission on: report goodput "
              "(default: admission off, p99)")
@click.option("--variants", default=None, help="comma-separated (default: all four)")
@click.option("--json", "json_out", default=None, help="write the result object here")
def batching(workload_path: str, rates: str, slo_ms: float, jobs: int | None,
             deadline_ms: float | None, variants: str | None, json_out: str | None) -> None:
    """Sweep the rates and print the tables."""
    from ..sim.batching import VARIANTS, sweep, tables

    chosen = names(variants, tuple(VARIANTS), tuple(VARIANTS), "variant", "--variants")
    swept = positive_floats(rates, "--rates")
    result = sweep(load(workload_path), swept, slo_ms, variants=chosen, jobs=jobs,
                   deadline_ms=deadline_ms)
    write_json(result, json_out)
    click.echo(tables(result))


@sim.command(help="Write a generated many-model workload (dags/ format) at a chosen "
             "utilisation of five 14 GB GPUs: models of 0.8 to 5.7 GB, random DAG "
             "workflows, Poisson arrivals at the rate that gives --load.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--models", type=click.IntRange(min=1), default=9, show_default=True)
@click.option("--workflows", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--load", "load_", type=click.FloatRange(min=0, min_open=True), default=0.8,
              show_default=True, help="the share of the GPUs' time the jobs need")
@click.option("--jobs", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--out", default=None, help="write here (default: stdout)")
def generate(seed: int, models: int, workflows: int, load_: float, jobs: int,
             out: str | None) -> None:
    """Write (or print) one generated workload."""
    from ..sim.generate import generate as make

    text = json.dumps(make(seed, models=models, workflows=workflows, load=load_, jobs=jobs),
                      indent=2) + "\n"
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        click.echo(text, nl=False)
