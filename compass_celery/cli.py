"""``compass-celery`` and ``celery -A proj compass``: status, demo, bench, simulate.

One click group serves both: under ``celery`` the app comes from ``-A``; the
standalone script takes ``--app`` or a ``--redis`` URL.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from . import settings as settings_mod
from .state.urls import masked
from .tables import result_table, text_table

if TYPE_CHECKING:
    from .sim.hops import MeasuredHops


def _app_from(ctx: click.Context, app_path: str | None) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app_path:
        from celery.utils.imports import instantiate, symbol_by_name

        found = symbol_by_name(app_path)
        app = found if hasattr(found, "conf") else instantiate(app_path)
        if not hasattr(app, "conf"):
            app = getattr(found, "app", None) or getattr(found, "celery", None)
    return app


@click.group(name="compass", help="Compass scheduling for Celery: status, demo, bench, simulate.")
def compass_command() -> None:
    """The ``compass`` command group; each subcommand does its own work."""
    pass


@compass_command.command(help="Live workers, their models and backlogs, and the settings.")
@click.option("--app", "app_path", default=None, help="Celery app, e.g. proj.celery:app")
@click.option("--redis", "redis_url", default=None, help="state Redis URL (default: the app's)")
@click.option("--prefix", default=None, help="key prefix (default: the app's compass_key_prefix)")
@click.option("--settings/--no-settings", "show_settings", default=False,
              help="also print every compass_* setting")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="print one JSON object (workers, skipped records, settings) instead")
@click.pass_context
def status(ctx: click.Context, app_path: str | None, redis_url: str | None, prefix: str | None,
           show_settings: bool, as_json: bool) -> None:
    """Print the live workers the state Redis knows, and the settings when asked."""
    from .state.connection import StateUnavailable
    from .state.store import RedisStateStore

    app = _app_from(ctx, app_path)
    values = app.compass.settings if app is not None and hasattr(app, "compass") else \
        settings_mod.resolve({})
    if redis_url is None and app is not None and hasattr(app, "compass"):
        redis_url = app.compass.redis_url
    if redis_url is None:
        raise click.UsageError("no state Redis: give --redis URL or --app with Compass(app)")
    store = RedisStateStore(redis_url, prefix or values["key_prefix"])
    try:
        snap = store.snapshot(time.time(), values["heartbeat_timeout_s"])
    except StateUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(_status_json(snap, masked(redis_url), values), indent=2,
                              default=str))
        return
    rows = [[w.name, w.device, f"{w.gpu_free_mb:.0f}/{w.gpu_total_mb:.0f}",
             _models(w), f"{w.backlog_ms:.0f}", f"{w.pending_ms:.0f}",
             f"{w.hop_ms:.1f}", f"{time.time() - w.heartbeat:.1f}s"] for w in snap.workers]
    click.echo(f"{len(snap.workers)} live compass worker(s) at {masked(redis_url)}")
    if rows:
        click.echo(text_table(rows, ["worker", "device", "free/total MB", "resident models",
                                 "backlog ms", "pending ms", "hop ms", "heartbeat"]))
    for why in snap.skipped:
        click.echo(f"skipped: {why}")
    if show_settings:
        click.echo(text_table([list(r) for r in settings_mod.describe(values)],
                          ["setting", "value", "meaning"]))


def _models(w: Any) -> str:
    """The status table's models: the resident ones, then those being loaded."""
    text = ",".join(sorted(w.resident)) or "-"
    return f"{text} (loading {','.join(sorted(w.loading))})" if w.loading else text


def _status_json(snap: Any, redis_url: str, values: dict[str, Any]) -> dict[str, Any]:
    """``compass status --json``: what the table shows, as numbers and lists."""
    workers = [{"name": w.name, "queue": w.queue, "device": w.device,
                "gpu_free_mb": w.gpu_free_mb, "gpu_total_mb": w.gpu_total_mb,
                "resident": sorted(w.resident), "host_resident": sorted(w.host_resident),
                "backlog_ms": w.backlog_ms, "pending_ms": w.pending_ms, "speed": w.speed,
                "hop_ms": w.hop_ms, "loading": sorted(w.loading),
                "heartbeat_age_s": round(time.time() - w.heartbeat, 3)}
               for w in snap.workers]
    settings = {f"compass_{name}": masked(value) if isinstance(value, str) else value
                for name, value in values.items() if name in settings_mod.OPTIONS}
    return {"redis": redis_url, "workers": workers, "skipped": list(snap.skipped),
            "settings": settings}


@compass_command.command(help="Start a private Redis and emulated-GPU workers, send a burst of "
                         "tasks and show where each went and why.")
@click.option("--redis", "redis_url", default=None,
              help="use this Redis instead of starting a private redis-server")
@click.option("--workers", "n_workers", default=4, show_default=True, type=click.IntRange(2, 8))
@click.option("--tasks", "n_tasks", default=16, show_default=True, type=click.IntRange(1, 500))
@click.option("--jobs", "n_jobs", default=150, show_default=True, type=click.IntRange(0, 5000),
              help="jobs in the side-by-side run (0 skips it)")
@click.option("--plot", "plot_path", default="compass-demo.png", show_default=True)
@click.option("--real", is_flag=True, help="instead: two CPU workers run real pretrained "
              "models (needs pip install 'compass-celery[real]') for a voice search")
def demo(redis_url: str | None, n_workers: int, n_tasks: int, n_jobs: int,
         plot_path: str, real: bool) -> None:
    """Run the emulated-GPU demo (:func:`~compass_celery.demo.run_demo`), or with ``--real``
    the pretrained-model one; exit with its status."""
    if real:
        from .pretrained.demo import run_real_demo
        from .pretrained.models import PretrainedMissing, warm_imports

        try:
            warm_imports()
        except PretrainedMissing as exc:
            raise click.ClickException(str(exc)) from None
        sys.exit(run_real_demo(redis_url, echo=click.echo))
    from .demo import run_demo

    sys.exit(run_demo(redis_url, n_workers, n_tasks, echo=click.echo, side_by_side_jobs=n_jobs,
                      plot_path=plot_path or None))


def _load(path: str, seed: int | None = None) -> Any:
    """A workload file, or a shipped workload by name (``voice-real``); ``seed``, when
    given, replaces its arrival seed (``Workload.reseeded``)."""
    import os

    from .workload import WorkloadError, load_workload
    from .workloads import path as shipped

    if not os.path.exists(path) and os.sep not in path:
        name = path if path.endswith((".json", ".yaml", ".yml")) else f"{path}.json"
        if shipped(name).exists():
            path = str(shipped(name))
    try:
        workload = load_workload(path)
    except WorkloadError as exc:
        raise click.ClickException(f"bad workload {path}: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot read workload {path}: {exc}") from None
    return workload if seed is None else workload.reseeded(seed)


def _policies(text: str | None, default: list[str],
              extra: tuple[str, ...] = ()) -> list[str]:
    from .planner import POLICIES

    known = (*POLICIES, *extra)
    names = [p.strip() for p in text.split(",") if p.strip()] if text else list(default)
    bad = [p for p in names if p not in known]
    if bad:
        raise click.BadParameter(f"unknown policy {bad[0]!r}; known: {', '.join(known)}",
                                 param_hint="--policies")
    return names


def _floats(text: str | None, what: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}",
                                 param_hint=what) from None


#: ``bench`` and ``simulate`` alike: the same workload on other arrivals.
_SEED = click.option("--seed", type=int, default=None,
                     help="draw the arrivals and the template mix from this seed instead of "
                     "the workload's (a rerun on fresh arrivals)")


@compass_command.command(help="Real Redis-backed Celery cluster of emulated-GPU workers; "
                         "every policy side by side on the same arrivals.")
@click.option("--workload", "workload_path", required=True, help="workload file (JSON/YAML)")
@click.option("--policies", default=None, help="comma-separated subset (default: all)")
@click.option("--json", "json_out", default=None, help="write the result object here")
@click.option("--plot", "plot_out", default=None, help="write latency CDFs and bars (PNG)")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=None, help="jobs per second")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None, help="job count")
@_SEED
@click.option("--time-scale", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="real seconds per workload second (emulated sleeps and arrival gaps)")
@click.option("--warmup-frac", type=click.FloatRange(0, 0.9), default=0.1, show_default=True)
@click.option("--redis", "redis_url", default=None, help="use this Redis (default: private)")
@click.option("--broker", "broker_url", default=None,
              help="the workers' broker, e.g. amqp://guest:guest@127.0.0.1:5672/VHOST for "
              "RabbitMQ; compass state stays in the Redis (default: the Redis)")
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None,
              help="override the cluster's worker count")
@click.option("--sweep-rate", default=None, help="comma-separated rates: latency against load")
@click.option("--min-workers", "slo_ms", type=click.FloatRange(min=0), default=None,
              help="smallest worker count keeping p99 under this SLO (ms), per policy")
@click.option("--kill-worker-after", type=click.FloatRange(min=0), default=None,
              help="SIGKILL one worker this many real seconds into each policy's run")
@click.option("--kill-restart", "kill_restarts", type=click.IntRange(min=1), default=None,
              help="from 3 s, SIGKILL a random worker this many times at random moments "
              "(1.5 s apart on average) and restart it at once under its own name")
@click.option("--restart-redis-after", type=click.FloatRange(min=0), default=None,
              help="restart the private Redis this many real seconds into each run")
@click.option("--redis-aof/--no-redis-aof", default=False, show_default=True,
              help="the private Redis keeps an append-only file, so a restart keeps queues "
              "and records (without it a restart loses them, by design)")
@click.option("--rolling-restart-after", type=click.FloatRange(min=0), default=None,
              help="this many real seconds into each run, SIGTERM each worker in turn (a "
              "deploy's warm shutdown), wait for its clean exit, start it again under the "
              "same name, under load")
@click.option("--pause-redis-after", type=click.FloatRange(min=0), default=None,
              help="freeze the private Redis (SIGSTOP, then SIGCONT) this many real seconds "
              "into each run")
@click.option("--pause-redis-for", type=click.FloatRange(min=0), default=None,
              help="how long Redis stays frozen, real s [default: twice the workers' "
              "heartbeat timeout, 3 s in the bench]")
@click.option("--skew-clock-s", type=float, default=None,
              help="one worker runs with its wall clock this many seconds ahead")
@click.option("--long-task-s", type=click.FloatRange(min=0.1), default=None,
              help="add one job of one task that runs this many real seconds; the workers' "
              "visibility timeout is lowered to half of it, so the task outlives it")
@click.option("--cache-policy", type=click.Choice(["lookahead", "lru", "fifo"]), default=None,
              help="workers' eviction policy (default: lru for celery-default, else lookahead)")
@click.option("--compare-sim", is_flag=True,
              help="also simulate the same workload, arrivals and cluster, and print real "
              "against simulated latency per policy (the gap is the real cluster's overhead)")
@click.option("--real", is_flag=True,
              help="workers run real pretrained models on the CPU (needs the real extra: "
              "pip install 'compass-celery[real]'), one torch thread each, with the "
              "workload's GPU memory as their memory budget; run times are learned, not "
              "declared, and the time scale is 1")
@click.option("--admission", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="refuse at submission a job its plan says will miss its SLO deadline "
              "(off: take it, marked late; a job that falls behind is still shed). Jobs carry "
              "the SLO classes of the workload's slo section; celery-default and "
              "celery-expires never refuse (plain Celery has no admission)")
@click.option("--headroom", type=click.FloatRange(0, 1, max_open=True), default=None,
              help="share of a deadline admission keeps for the plan's error "
              "(compass_admission_headroom; default: the app's)")
@click.option("--quiet", is_flag=True, help="no progress bar")
def bench(workload_path: str, policies: str | None, json_out: str | None,
          plot_out: str | None, rate: float | None, n_jobs: int | None, seed: int | None,
          time_scale: float, warmup_frac: float, redis_url: str | None, broker_url: str | None,
          n_workers: int | None,
          sweep_rate: str | None, slo_ms: float | None, kill_worker_after: float | None,
          kill_restarts: int | None,
          restart_redis_after: float | None, redis_aof: bool,
          rolling_restart_after: float | None, pause_redis_after: float | None,
          pause_redis_for: float | None, skew_clock_s: float | None,
          long_task_s: float | None, cache_policy: str | None, compare_sim: bool,
          real: bool, admission: str, headroom: float | None, quiet: bool) -> None:
    """Run the real-cluster benchmark with the given faults; print and write the result.
    Besides the planner's policies, ``--policies`` takes celery-expires: plain Celery with
    ``expires=`` at each job's deadline, what a Celery user would do about deadlines today."""
    from .bench.options import VARIANTS
    from .bench.runner import POLICIES, BenchOptions
    from .bench.slo import slo_table
    from .bench.suite import run_suite

    workload = _load(workload_path, seed)
    if redis_url is not None:
        needs_private = [flag for flag, on in (
            ("--restart-redis-after", restart_redis_after is not None),
            ("--pause-redis-after", pause_redis_after is not None),
            ("--redis-aof", redis_aof)) if on]
        if needs_private:
            raise click.UsageError(f"{needs_private[0]} needs the bench's private Redis: "
                                   "drop --redis")
    if broker_url is not None:
        from .broker.amqp import is_amqp

        if not is_amqp(broker_url):
            raise click.UsageError("--broker takes an amqp:// URL (a Redis broker is --redis)")
        redis_only = [flag for flag, on in (
            ("--restart-redis-after", restart_redis_after is not None),
            ("--pause-redis-after", pause_redis_after is not None),
            ("--redis-aof", redis_aof)) if on]
        if redis_only:
            raise click.UsageError(f"{redis_only[0]} acts on the broker Redis: it does not "
                                   "apply over AMQP, where RabbitMQ is the broker")
    if pause_redis_for is not None and pause_redis_after is None:
        raise click.UsageError("--pause-redis-for needs --pause-redis-after")
    if real:
        time_scale = 1.0  # real compute runs at its own speed
    opts = BenchOptions(real=real, policies=_policies(policies, POLICIES, tuple(VARIANTS)),
                        rate=rate, jobs=n_jobs, admission=admission == "on",
                        headroom=headroom,
                        time_scale=time_scale, warmup_frac=warmup_frac, redis_url=redis_url,
                        broker_url=broker_url,
                        workers=n_workers, kill_worker_after=kill_worker_after,
                        kill_restarts=kill_restarts,
                        restart_redis_after=restart_redis_after, progress=not quiet,
                        cache_policy=cache_policy, redis_aof=redis_aof,
                        rolling_restart_after=rolling_restart_after,
                        pause_redis_after=pause_redis_after, pause_redis_for=pause_redis_for,
                        skew_clock_s=skew_clock_s, long_task_s=long_task_s)
    try:
        result = run_suite(workload, opts, sweep=_floats(sweep_rate, "--sweep-rate"),
                           slo_ms=slo_ms, echo=click.echo)
    except ConnectionError as exc:
        raise click.ClickException(str(exc)) from None
    timings = "real compute on the CPU" if real else "emulated GPU timings"
    click.echo(f"\n{workload.name}: {timings}, time scale {time_scale}, "
               f"latency in workload ms (first {warmup_frac:.0%} of jobs left out)")
    click.echo(result_table(result))
    click.echo("dup: executions beyond the first; stranded: messages left in a queue, "
               "staging list or unacked entry after the run")
    slos = slo_table(result)
    if slos:
        click.echo(f"\nSLO outcomes (admission {admission}; after warm-up; goodput: jobs "
                   f"that met their deadline per second):\n{slos}")
    if compare_sim and not sweep_rate:
        _compare_with_sim(result, workload, real, n_workers, rate, n_jobs, warmup_frac)
    _write_outputs(result, json_out, plot_out)


def _per_task_cost(result: dict[str, Any], real: bool
                   ) -> tuple[float, str, MeasuredHops | None]:
    """What each task cost the real workers beyond its run, for the simulator's hop (ms;
    the median over policies) and how it is made up: the mean hop (the busy time the
    hops took), the median start-up of a task on a resident model (its inputs and
    bookkeeping before the run) and, on emulated GPUs, the median overshoot of a run
    over its declared time (a real-compute run feeds the simulator measured run times
    instead). Last, that policy's measured hops and per-task overshoots themselves, to
    draw task by task (``None`` where the run kept no hops)."""
    from .bench.terms import run_overshoot_ms, startup_ms, task_overshoots
    from .sim.hops import MeasuredHops

    parts = []  # (mean hop, start-up, run overshoot, the measured ones) per policy
    for r in result["policies"].values():
        hop = r.get("hop_mean_ms") or r.get("hop_ms")
        if hop:
            rows = r.get("prediction_rows", [])
            parts.append((hop, startup_ms(rows),
                          0.0 if real else max(0.0, run_overshoot_ms(rows)),
                          MeasuredHops.of(r.get("hop_gaps_ms") or [],
                                          task_overshoots(rows, real))))
    if not parts:
        return 0.0, "", None
    hop, start, over, measured = sorted(parts, key=lambda p: sum(p[:3]))[len(parts) // 2]
    why = f"mean hop {hop:g} ms" + (f" + start-up {start:g} ms" if start else "") + (
        f" + run overshoot {over:g} ms" if over else "")
    return round(hop + start + over, 1), why, measured


#: How many independent draws of the measured per-task costs ``--compare-sim`` simulates:
#: one draw is one outcome, and on a busy fan-out workload they differ by tens of percent.
SIM_DRAWS = 9


def _compare_with_sim(result: dict[str, Any], workload: Any, real: bool,
                      n_workers: int | None, rate: float | None, n_jobs: int | None,
                      warmup_frac: float) -> None:
    """Simulate the same workload, arrivals and cluster (fed the measured costs after a
    real-compute run), and print real against simulated, per policy: at zero hop, with
    the measured per-task cost as a constant, and with it drawn task by task (the median
    of ``SIM_DRAWS`` independent draws, and their range)."""
    from .sim.runner import simulate as run_sim
    from .sim.runner import simulate_draws

    if real:  # the simulator replays the costs the CPUs really had
        from .bench.measured import measured_workload

        rows = [row for r in result["policies"].values()  # every policy's measurements
                for row in r.get("prediction_rows", [])]
        workload = measured_workload(workload, rows)
        result["simulated_workload"] = workload.description
    hop, why, measured = _per_task_cost(result, real)
    result["simulated_hop_ms"] = hop
    runs = [("zero hop overhead", "", 0.0, None)]
    if hop:
        runs.append((f"the measured per-task cost, {hop} ms ({why})", "_hop", hop, None))
    if hop and measured is not None:
        plus = (", each plus a start-up" + ("" if real else " and a run overshoot")
                if measured.overshoots_ms else "")
        runs.append((f"the measured per-task costs drawn task by task "
                     f"({len(measured.hops_ms)} hops{plus}), the median of {SIM_DRAWS} "
                     "draws", "_drawn", hop, measured))
    names = list(result["policies"])
    kw = {"workers": n_workers, "rate": rate, "jobs": n_jobs, "warmup_frac": warmup_frac}
    for label, key, hop_ms, draws in runs:
        spread = None
        if draws is None:
            simulated = run_sim(workload, names, hop_ms=hop_ms, **kw)["policies"]
        else:
            spread = simulate_draws(workload, names, draws, SIM_DRAWS, hop_ms=hop_ms, **kw)
            simulated = {name: s.pop("run") for name, s in spread.items()}
            result[f"simulated{key}_spread"] = spread
        result[f"simulated{key}"] = simulated
        result[f"real_over_sim{key}"] = ratios = real_over_sim(result["policies"], simulated)
        click.echo(f"\nreal cluster against the simulator (same arrivals, {label}), "
                   "workload ms")
        click.echo(_real_sim_table(ratios))
        if spread is not None:
            click.echo(_spread_lines(spread, result["policies"]))
    click.echo("loads: model loads after warm-up, as a share of the tasks after warm-up")


def _spread_lines(spread: dict[str, Any], real: dict[str, Any]) -> str:
    """Per policy, the simulated means and loads over the draws, and where the real ones
    fall among them."""
    lines = []
    for name, s in spread.items():
        means, loads = s["mean_ms"], s["loads_after_warmup"]
        mean, loaded = real[name]["latency_ms"]["mean"], real[name].get("loads_after_warmup", 0)
        lines.append(f"  {name}: simulated mean {means['min']:.1f} to {means['max']:.1f} ms "
                     f"over {s['draws']} draws, real {mean:.1f} ({_where(mean, means)}); "
                     f"loads after warm-up {loads['min']} to {loads['max']}, real {loaded} "
                     f"({_where(loaded, loads)})")
    return "\n".join(lines)


def _where(value: float, span: dict[str, float]) -> str:
    if value > span["max"]:
        return f"{value / span['max']:.2f}x the largest" if span["max"] else "above"
    if value < span["min"]:
        return f"{value / span['min']:.2f}x the least"
    return "within"


def _real_sim_table(ratios: dict[str, Any]) -> str:
    return text_table([[name, f"{r['real_mean']:.1f}", f"{r['sim_mean']:.1f}",
                        f"{r['mean']:.2f}x", f"{r['real_p99']:.1f}", f"{r['sim_p99']:.1f}",
                        f"{r['p99']:.2f}x", _pct(r["real_load_fraction"]),
                        _pct(r["sim_load_fraction"])] for name, r in ratios.items()],
                      ["policy", "real mean", "sim mean", "real/sim", "real p99",
                       "sim p99", "real/sim", "real loads", "sim loads"])


def real_over_sim(real: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """Per policy: real and simulated mean and p99 latency, and their ratios."""
    out = {}
    for name, r in real.items():
        s = simulated.get(name)
        if s is None:
            continue
        rm, sm = r["latency_ms"]["mean"], s["latency_ms"]["mean"]
        rp, sp = r["latency_ms"]["p99"], s["latency_ms"]["p99"]
        out[name] = {"real_mean": rm, "sim_mean": sm, "mean": rm / sm if sm else float("nan"),
                     "real_p99": rp, "sim_p99": sp, "p99": rp / sp if sp else float("nan"),
                     "real_load_fraction": r.get("load_fraction"),
                     "sim_load_fraction": s.get("load_fraction")}
    return out


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


@compass_command.command(help="Discrete-event simulation of the same planner on any cluster "
                         "size.")
@click.option("--workload", "workload_path", required=True)
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None)
@click.option("--policies", default=None,
              help="comma-separated subset (default: every real policy); static-replicas "
              "is a simulator-only reference: replicas sized from the workload, pinned")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=None)
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None)
@_SEED
@click.option("--hop-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="modelled fixed dispatch overhead per task (broker and bookkeeping round "
              "trips), workload ms, which workers publish and plans count, as real ones "
              "learn theirs; calibrate it from a real bench run (docs/BENCHMARKS.md)")
@click.option("--json", "json_out", default=None)
def simulate(workload_path: str, n_workers: int | None, policies: str | None,
             rate: float | None, n_jobs: int | None, seed: int | None, hop_ms: float,
             json_out: str | None) -> None:
    """Simulate the policies on the workload; print latency, time per task and planning time."""
    from .bench.runner import POLICIES
    from .sim.runner import SIM_ONLY_POLICIES
    from .sim.runner import simulate as run_sim

    workload = _load(workload_path, seed)
    result = run_sim(workload, _policies(policies, POLICIES, SIM_ONLY_POLICIES),
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
    _write_outputs(result, json_out, None)


@compass_command.command(name="device-check",
                         help="The real model cache (loads, evictions, prefetch, refusals, "
                         "CUDA out-of-memory) and real forward passes on one device, then "
                         "the real-compute benchmark on it; runs unchanged on cpu.")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N or cpu")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=0), default=120, show_default=True,
              help="jobs of the real-compute benchmark (0: no benchmark)")
@click.option("--workload", "workload_path", default="voice-real", show_default=True,
              help="the benchmark's workload (a shipped name or a file)")
@click.option("--json", "json_out", default=None, help="write the figures here")
def device_check(device: str, n_jobs: int, workload_path: str, json_out: str | None) -> None:
    """Run the device check; print Markdown tables; write the JSON."""
    import json

    from .bench.device_check import markdown, run_device_check
    from .bench.runner import BenchOptions
    from .bench.suite import run_suite

    def bench(dev: str) -> dict[str, Any]:
        opts = BenchOptions(policies=["celery-default", "compass"], jobs=n_jobs, real=True,
                            device=dev, time_scale=1.0, progress=False)
        return run_suite(_load(workload_path), opts, echo=click.echo)

    result = run_device_check(device, bench if n_jobs else None, echo=click.echo)
    click.echo(markdown(result))
    if "bench" in result:
        click.echo(result_table(result["bench"]))
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
        click.echo(f"wrote {json_out}")


def _write_outputs(result: dict[str, Any], json_out: str | None, plot_out: str | None) -> None:
    import json

    if json_out:
        slim = {**result, "policies": {k: {f: v for f, v in r.items() if f != "latencies_ms"}
                                       for k, r in result["policies"].items()}}
        with open(json_out, "w") as fh:
            json.dump(slim, fh, indent=2)
        click.echo(f"wrote {json_out}")
    if plot_out:
        from .bench.plot import plot_result

        plot_result(result, plot_out)
        click.echo(f"wrote {plot_out}")


@compass_command.command(help="The regression gate: simulate every shipped workload and a "
                         "1,000-worker cluster and time the hot path, alternating today's "
                         "tree with a base commit's; exits 1 when a timing is slower beyond "
                         "the spread of the rounds.")
@click.option("--base", "base_rev", default="HEAD", show_default=True,
              help="commit to compare the working tree with")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--chains/--no-chains", default=True, show_default=True,
              help="also time a 3-task Dag against Celery's chain on two workers")
@click.option("--tolerance", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="a timing is slower only beyond this share of the base, too")
def regress(base_rev: str, rounds: int, chains: bool, tolerance: float) -> None:
    """Run the regression gate and exit with its verdict."""
    from .bench.regress import report, run

    verdicts = run(base_rev, rounds, chains, tolerance, echo=click.echo)
    sys.exit(0 if report(verdicts, echo=click.echo) else 1)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``compass-celery`` console script."""
    compass_command.main(args=argv, prog_name="compass-celery", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
