"""``compass-celery bench cluster``: the real Redis-backed cluster, every policy side by side.

The command's 29 flags are gathered once into :class:`ClusterArgs`, a frozen dataclass;
the functions below take that, each doing one thing: refuse flags that cannot go
together, build the runner's :class:`~compass_celery.bench.options.BenchOptions`, print.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from ..tables import result_table
from .common import SEED, floats, load, write_outputs
from .common import policies as policy_list
from .compare import compare_with_sim


@dataclass(frozen=True)
class ClusterArgs:
    """``bench cluster``'s flags, as click parsed them (see its ``--help``)."""

    workload_path: str
    policies: str | None
    json_out: str | None
    plot_out: str | None
    rate: float | None
    n_jobs: int | None
    seed: int | None
    time_scale: float
    warmup_frac: float
    redis_url: str | None
    broker_url: str | None
    n_workers: int | None
    sweep_rate: str | None
    slo_ms: float | None
    kill_worker_after: float | None
    kill_restarts: int | None
    restart_redis_after: float | None
    redis_aof: bool
    rolling_restart_after: float | None
    pause_redis_after: float | None
    pause_redis_for: float | None
    skew_clock_s: float | None
    long_task_s: float | None
    cache_policy: str | None
    compare_sim: bool
    real: bool
    admission: str
    headroom: float | None
    hold_max_ms: float | None
    quiet: bool


def refuse_conflicts(args: ClusterArgs) -> None:
    """A usage error for flags that cannot go together: a fault on the private Redis with
    ``--redis``, or over AMQP; ``--pause-redis-for`` alone."""
    redis_faults = [flag for flag, on in (
        ("--restart-redis-after", args.restart_redis_after is not None),
        ("--pause-redis-after", args.pause_redis_after is not None),
        ("--redis-aof", args.redis_aof)) if on]
    if args.redis_url is not None and redis_faults:
        raise click.UsageError(f"{redis_faults[0]} needs the bench's private Redis: "
                               "drop --redis")
    if args.broker_url is not None:
        from ..broker.amqp import is_amqp

        if not is_amqp(args.broker_url):
            raise click.UsageError("--broker takes an amqp:// URL (a Redis broker is --redis)")
        if redis_faults:
            raise click.UsageError(f"{redis_faults[0]} acts on the broker Redis: it does not "
                                   "apply over AMQP, where RabbitMQ is the broker")
    if args.pause_redis_for is not None and args.pause_redis_after is None:
        raise click.UsageError("--pause-redis-for needs --pause-redis-after")
    if args.hold_max_ms is not None and args.real:
        raise click.UsageError("--hold-max-ms sets the emulated workers' held slot; real "
                               "compute workers take compass_hold_max_ms from their app")


def bench_options(args: ClusterArgs) -> Any:
    """The runner's options for these flags (real compute runs at time scale 1)."""
    from ..bench.options import VARIANTS
    from ..bench.runner import POLICIES, BenchOptions

    return BenchOptions(
        real=args.real, policies=policy_list(args.policies, POLICIES, tuple(VARIANTS)),
        rate=args.rate, jobs=args.n_jobs, admission=args.admission == "on",
        headroom=args.headroom, time_scale=1.0 if args.real else args.time_scale,
        warmup_frac=args.warmup_frac, redis_url=args.redis_url, broker_url=args.broker_url,
        workers=args.n_workers, kill_worker_after=args.kill_worker_after,
        kill_restarts=args.kill_restarts, restart_redis_after=args.restart_redis_after,
        progress=not args.quiet, cache_policy=args.cache_policy, redis_aof=args.redis_aof,
        rolling_restart_after=args.rolling_restart_after,
        pause_redis_after=args.pause_redis_after, pause_redis_for=args.pause_redis_for,
        skew_clock_s=args.skew_clock_s, long_task_s=args.long_task_s,
        extra_env=({} if args.hold_max_ms is None
                   else {"COMPASS_HOLD_MAX_MS": str(args.hold_max_ms)}))


def print_result(result: dict[str, Any], workload: Any, args: ClusterArgs,
                 time_scale: float) -> None:
    """The result table, what its columns mean, and the SLO outcomes when there are any."""
    from ..bench.slo import slo_table
    from ..results import BATCH_SHARE_HEADING, batch_share_lines

    timings = "real compute on the CPU" if args.real else "emulated GPU timings"
    click.echo(f"\n{workload.name}: {timings}, time scale {time_scale}, "
               f"latency in workload ms (first {args.warmup_frac:.0%} of jobs left out)")
    click.echo(result_table(result))
    click.echo("dup: executions beyond the first; stranded: messages left in a queue, "
               "staging list or unacked entry after the run")
    slos = slo_table(result)
    if slos:
        click.echo(f"\nSLO outcomes (admission {args.admission}; after warm-up; goodput: "
                   f"jobs that met their deadline per second):\n{slos}")
    shares = batch_share_lines(result)
    if shares:
        click.echo(f"\n{BATCH_SHARE_HEADING}\n{shares}")


@click.command(name="cluster", help="A real Redis-backed Celery cluster of emulated-GPU "
               "workers (or CPU workers running real models, --real): every policy side by "
               "side on the same arrivals, with the faults asked for. Measures latency "
               "(mean, p50/p95/p99), completed, failed, lost and duplicated jobs, cache hit "
               "rate, model loads and throughput, and with deadlines the SLO outcomes.")
@click.option("--workload", "workload_path", required=True, help="workload file (JSON/YAML)")
@click.option("--policies", default=None, help="comma-separated subset (default: all)")
@click.option("--json", "json_out", default=None, help="write the result object here")
@click.option("--plot", "plot_out", default=None, help="write latency CDFs and bars (PNG)")
@click.option("--rate", type=click.FloatRange(min=1e-6), default=None, help="jobs per second")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1), default=None, help="job count")
@SEED
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
@click.option("--hold-max-ms", type=click.FloatRange(min=0), default=None,
              help="the workers' held slot (compass_hold_max_ms, emulated workers and "
              "the producer; the simulator of --compare-sim too; default: the "
              "setting's default; 0: off)")
@click.option("--quiet", is_flag=True, help="no progress bar")
def cluster(**params: Any) -> None:
    """Run the real-cluster benchmark with the given faults; print and write the result.
    Besides the planner's policies, ``--policies`` takes celery-expires: plain Celery with
    ``expires=`` at each job's deadline, what a Celery user would do about deadlines today."""
    from ..bench.suite import run_suite
    from ..sim.options import SimOptions

    args = ClusterArgs(**params)
    workload = load(args.workload_path, args.seed)
    refuse_conflicts(args)
    opts = bench_options(args)
    try:
        result = run_suite(workload, opts, sweep=floats(args.sweep_rate, "--sweep-rate"),
                           slo_ms=args.slo_ms, echo=click.echo)
    except ConnectionError as exc:
        raise click.ClickException(str(exc)) from None
    print_result(result, workload, args, opts.time_scale)
    if args.compare_sim and not args.sweep_rate:
        compare_with_sim(result, workload, args.real,
                         SimOptions(workers=args.n_workers, rate=args.rate, jobs=args.n_jobs,
                                    warmup_frac=args.warmup_frac,
                                    **({} if args.hold_max_ms is None
                                       else {"hold_max_ms": args.hold_max_ms})))
    write_outputs(result, args.json_out, args.plot_out)
