"""``compass-celery autoscale``: the autoscalers side by side in the simulator, on
compressed traces (``compass_celery.sim.scaling``)."""

from __future__ import annotations

import shlex

import click

from .common import load, names, write_json

DEFAULT_AUTOSCALERS = ("compass-plan", "keda-queue", "keda-queue:2", "keda-queue:1", "ray-ongoing",
                       "fixed-peak")


@click.command(help="Replay a workload on compressed traces (a diurnal day, a bursty one, "
               "a step) under each autoscaler, on the same compass placement and admission; "
               "print GPU-hours (at the trace's scale), SLO attainment, goodput and cold "
               "starts. keda-queue:N and ray-ongoing:N set their per-worker target, fixed-peak:N "
               "the fixed fleet; "
               "compass-plan:no-hints and compass-plan:newest leave out its preload hints or "
               "its choice of the worker to drain.")
@click.option("--workload", "workload_path", default="autoscale-mix", show_default=True)
@click.option("--traces", "trace_names", default="diurnal,bursty,step", show_default=True)
@click.option("--autoscalers", default=",".join(DEFAULT_AUTOSCALERS), show_default=True)
@click.option("--duration-s", type=click.FloatRange(min=1.0), default=720.0, show_default=True,
              help="workload seconds a day is compressed to")
@click.option("--peak", type=click.FloatRange(min=0.01), default=30.0, show_default=True,
              help="jobs per second at the traces' peak")
@click.option("--cold-start-s", type=click.FloatRange(min=0.0), default=60.0,
              show_default=True, help="real seconds from asking for a worker to it taking "
              "work, before its model loads (compressed with the trace)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", default=None)
@click.option("--out", "text_out", default=None,
              help="also write the table here, the command at its top")
def autoscale(workload_path: str, trace_names: str, autoscalers: str, duration_s: float,
              peak: float, cold_start_s: float, seed: int, json_out: str | None,
              text_out: str | None) -> None:
    """Run every autoscaler on every trace and print the table."""
    from ..sim import scaling, traces

    workload = load(workload_path)
    chosen = [a.strip() for a in autoscalers.split(",") if a.strip()]
    for name in chosen:  # every name checked before minutes of running
        try:
            scaling.parse(name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--autoscalers") from None
    made = [traces.make(t, duration_s, peak, seed)
            for t in names(trace_names, traces.TRACES, traces.TRACES, "trace", "--traces")]
    results: dict[str, dict[str, dict[str, object]]] = {}
    for trace in made:
        results[trace.name] = {}
        for name in chosen:
            click.echo(f"{trace.name}: {name} ...", err=True)
            try:
                results[trace.name][name] = scaling.run(
                    workload, name, scaling.Setup(trace, cold_start_s=cold_start_s), seed)
            except ValueError as exc:
                raise click.ClickException(str(exc)) from None
    head = (f"{workload.name}: a day compressed to {duration_s:g} s (x{made[0].compression:g}), "
            f"peak {peak:g} jobs/s, cold start {cold_start_s:g} s real; GPU-hours at the "
            f"trace's scale; attainment over every job (adm: over the admitted)")
    text = head + "\n" + scaling.table(results)
    click.echo(text)
    if text_out:
        args = [f"--workload {shlex.quote(workload_path)}", f"--traces {trace_names}",
                f"--autoscalers {autoscalers}", f"--duration-s {duration_s:g}",
                f"--peak {peak:g}", f"--cold-start-s {cold_start_s:g}", f"--seed {seed}"]
        command = "compass-celery autoscale " + " ".join(args)
        with open(text_out, "w") as fh:
            fh.write(f"$ {command}\n\n{text}\n")
    if json_out:
        write_json({"workload": workload.name, "traces": results}, json_out)
