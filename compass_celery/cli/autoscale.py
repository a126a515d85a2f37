"""``compass-celery autoscale``: the autoscalers side by side in the simulator, on
compressed traces (``compass_celery.sim.scaling``)."""

from __future__ import annotations

import shlex
from collections import Counter

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
               "its choice of the worker to drain, and compass-plan:KEY=VALUE[+KEY=VALUE] "
               "sets its sizing knobs (headroom, max_util, window, horizon, down, "
               "trend_sigma, noise_sigma, levels, short, recent, pooled; periods in real "
               "seconds). "
               "Under the table, each compass-plan row's saving against the cheapest "
               "keda-queue and fixed-peak rows that keep 99% of their admitted jobs in time "
               "and meet compass-plan's share of all jobs less 1 point, and each trace's "
               "floor: the GPU-hours of a fleet that knew the rate, started workers "
               "instantly and kept each fully busy, which bounds any saving.")
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
    floors = {t.name: scaling.floor_gpu_hours(workload, t) for t in made}
    text = head + "\n" + scaling.table(results) + "\n\n" + scaling.summary(results, floors)
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


@click.command("autoscale-real", help="Scale real emulated-GPU workers on this machine "
               "(the local provider, a private redis-server) with the plan's rule while "
               "one trace's jobs arrive; audit the run as the fault benchmark does "
               "(nothing lost, nothing run twice), check each new worker held its hinted "
               "models before its first task, and compare its worker-seconds with the "
               "simulator's compass-plan on the same trace and arrivals.")
@click.option("--workload", "workload_path", default="autoscale-mix", show_default=True)
@click.option("--trace", "trace_name", type=click.Choice(["diurnal", "bursty", "step"]),
              default="step", show_default=True)
@click.option("--duration-s", type=click.FloatRange(min=10.0), default=240.0,
              show_default=True)
@click.option("--peak", type=click.FloatRange(min=0.01), default=8.0, show_default=True)
@click.option("--compression", type=click.FloatRange(min=1.0), default=10.0,
              show_default=True, help="real periods (poll, windows, cold start) divided "
              "by this")
@click.option("--cold-start-s", type=click.FloatRange(min=0.0), default=40.0,
              show_default=True, help="the simulator's cold start, real seconds before "
              "the compression (set it to the measured worker start x compression)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_out", default=None)
@click.option("--log-dir", default=None, help="keep the workers' logs here")
def autoscale_real(workload_path: str, trace_name: str, duration_s: float, peak: float,
                   compression: float, cold_start_s: float, seed: int,
                   json_out: str | None, log_dir: str | None) -> None:
    """One real autoscaled run and the simulator's on the same trace."""
    from ..bench.autoscaled import run_autoscaled
    from ..bench.options import BenchOptions
    from ..sim import traces

    trace = traces.make(trace_name, duration_s, peak, seed, compression=compression)
    opts = BenchOptions(time_scale=1.0, progress=False, drain_timeout_s=120.0)
    r = run_autoscaled(load(workload_path), trace, opts, seed=seed,
                       cold_start_s=cold_start_s, log_dir=log_dir,
                       echo=lambda m: click.echo(m, err=True))
    res = r["result"]
    ends = Counter(j["outcome"] for j in res["per_job"])
    click.echo(f"{trace_name} {duration_s:g} s, peak {peak:g}/s, x{compression:g}: "
               f"{r['jobs']} jobs, completed {res['completed']}, refused "
               f"{ends['rejected']}, shed {ends['shed']}, lost {res['lost']}, failed "
               f"{res['failed']}, duplicates "
               f"{res['duplicates']} (starts {res['duplicate_starts']}), stranded "
               f"{res['stranded']}, dead-lettered {res['dead_lettered']}")
    added = r["added"]
    held = sum(1 for a in added.values() if a["hint_resident"])
    before = sum(1 for a in added.values() if a["before_first_task"])
    hinted = sum(1 for a in added.values() if a["hint"])
    click.echo(f"workers added {len(added)} ({hinted} with a hint): hint resident at first "
               f"sight {held}/{len(added)}, loaded before its first task (log) "
               f"{before}/{len(added)}; worker-s real {r['worker_s']} sim "
               f"{r['sim_worker_s']} (ratio {r['ratio']})")
    counted = r["arrivals_counted"]
    click.echo(f"arrivals the controller read from Redis: {sum(counted.values())} of "
               f"{r['jobs']} jobs sent (" + ", ".join(f"{k} {v}" for k, v in counted.items())
               + ")")
    for name, code in sorted(r["exited"].items()):
        click.echo(f"worker {name} had exited (code {code}) before the audit: not drained; "
                   "its log says why", err=True)
    if json_out:
        write_json(r, json_out)
