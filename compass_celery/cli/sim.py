"""``compass-celery simulate``: the planner in a discrete-event simulator, any cluster size."""

from __future__ import annotations

import click

from ..tables import result_table, text_table
from .common import SEED, load, write_outputs
from .common import policies as policy_list


@click.command(help="Discrete-event simulation of the same planner on any cluster "
                         "size.")
@click.option("--workload", "workload_path", required=True)
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None)
@click.option("--policies", default=None,
              help="comma-separated subset (default: every real policy); static-replicas "
              "is a simulator-only reference: replicas sized from the workload, pinned")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=None)
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None)
@SEED
@click.option("--hop-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="modelled fixed dispatch overhead per task (broker and bookkeeping round "
              "trips), workload ms, which workers publish and plans count, as real ones "
              "learn theirs; calibrate it from a real bench run (docs/BENCHMARKS.md)")
@click.option("--json", "json_out", default=None)
def simulate(workload_path: str, n_workers: int | None, policies: str | None,
             rate: float | None, n_jobs: int | None, seed: int | None, hop_ms: float,
             json_out: str | None) -> None:
    """Simulate the policies on the workload; print latency, time per task and planning time."""
    from ..bench.runner import POLICIES
    from ..sim.runner import SIM_ONLY_POLICIES
    from ..sim.runner import simulate as run_sim

    workload = load(workload_path, seed)
    result = run_sim(workload, policy_list(policies, POLICIES, SIM_ONLY_POLICIES),
                     workers=n_workers, rate=rate,
                     jobs=n_jobs, hop_ms=hop_ms)
    hop = f", {hop_ms:g} ms modelled hop per task" if hop_ms else ""
    click.echo(f"{workload.name}: simulated, {n_workers or len(workload.cluster.workers)} "
               f"workers{hop}, latency in workload ms")
    click.echo(result_table(result))
    rows = [[name, *(f"{r['breakdown_ms'][k]:.1f}" for k in
                     ("queued_ms", "load_ms", "hop_ms", "run_ms")),
             f"{r['plan_ms']['p50']:.3f}", f"{r['plan_ms']['p99']:.3f}"]
            for name, r in result["policies"].items()]
    click.echo("\nmean per task (ms), and planning wall time per job (ms)")
    click.echo(text_table(rows, ["policy", "queued", "load", "hop", "run", "plan p50", "plan p99"]))
    write_outputs(result, json_out, None)
