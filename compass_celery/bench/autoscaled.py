"""A real autoscaled run: the local provider scales emulated-GPU workers on one trace
while the trace's jobs arrive, and the simulator replays the same trace and arrivals.

The controller (:class:`compass_celery.providers.Autoscaler`) ticks every ``poll_s``
real seconds over the compression, as the simulator's compass-plan does, with the same
rate window, down window and horizon; it learns the arrivals from what the submitting
side counted in Redis (``compass_count_arrivals``, :mod:`compass_celery.state.arrivals`),
as a controller in another process would, not from the benchmark's own stream; the
result says how many it counted against how many were sent.
The run is audited as the fault benchmark is (:mod:`compass_celery.bench.audit`):
executions per task id from the ledger (nothing run twice), messages left in any queue,
staging list or unacked hash (nothing lost), and every job's end; and, per worker it
added, whether the worker's first record already held the models it was told to
preload. Worker-seconds are billed from ``add`` to the end of the drain, as the
simulator bills.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..emulated import batched_tasks
from ..local import RedisServer, wait_until
from ..planner.scaling import Member, preload_hints, workers_needed
from ..providers import Autoscaler, LocalProvider
from ..sim import scaling
from ..sim.traces import Trace
from ..state.arrivals import ArrivalCounter
from ..workload import Workload
from .audit import stranded_messages
from .options import BenchOptions
from .runner import (
    _bench_app,
    _delivery_counts,
    _forget_previous_run,
    _measured,
    _send_stream,
    _wait_for_jobs,
    _Waiter,
    _worker_env,
    worker_kind,
)

PREFIX = "compass-bench-autoscale"


def _initial(scaler: Autoscaler, workload: Workload, rate: float, gpu_mb: float) -> None:
    """The fleet the rule asks for at the trace's first rate, each worker preloading its
    hint (the simulator's warm start)."""
    n0 = scaling.steady_workers(workload, rate)
    need = workers_needed(scaling.loads_at(workload, scaling.class_rates(workload, rate)),
                          [Member("w", gpu_mb=gpu_mb)], workload.models)
    for hint in preload_hints(n0, need, [], workload.models, gpu_mb):
        scaler.add(hint)


def _ticker(scaler: Autoscaler, period_s: float, end_s: float, stop: threading.Event,
            time_scale: float = 1.0) -> threading.Thread:
    """One decision at each multiple of ``period_s`` on the scaler's clock (real seconds
    are ``time_scale`` times longer) until ``end_s``, each at its scheduled time, as the
    simulator ticks (the tick reads the arrivals the producers counted in Redis). Ticks
    on a fixed schedule, not a period after the last one: those drift (3.01 s apart),
    and the damper then drops a recommendation a tick early. A tick missed under load is
    skipped, not run late twice."""

    def run() -> None:
        k = 1
        while not stop.wait(max(k * period_s - scaler.clock(), 0.0) * time_scale):
            k = max(k, int(scaler.clock() // period_s))  # behind: the latest one due
            if k * period_s >= end_s:
                return
            scaler.tick(k * period_s)
            k += 1

    thread = threading.Thread(target=run, name="compass-autoscaler", daemon=True)
    thread.start()
    return thread


def preloaded_before_first_task(log: str, hint: Sequence[str]) -> bool | None:
    """Whether a worker's log shows every hinted model loaded before its first task was
    received (None: the log shows no task)."""
    lines = log.splitlines()
    first = next((i for i, line in enumerate(lines) if "] received" in line), None)
    if first is None:
        return None
    loaded = {m for line in lines[:first] for m in hint if f"loaded model {m} " in line}
    return loaded == set(hint)


def _check_logs(log_dir: str, seen: dict[str, dict[str, Any]]) -> None:
    """Per worker: whether its log shows its hint loaded before its first task."""
    for name, record in seen.items():
        path = os.path.join(log_dir, name.replace("@", "_") + ".log")
        with open(path, errors="replace") as fh:
            record["before_first_task"] = preloaded_before_first_task(fh.read(),
                                                                       record["hint"])


def _dags(app: Any, workload: Workload, kind: Any, batched_nodes: dict[Any, Any]
          ) -> dict[str, Any]:
    """The workload's DAG templates on the submitting app, as the benchmark builds them."""
    from ..jobs.dag import Dag

    return {name: Dag.from_spec(app, s, task=kind.infer_task, step_task=kind.step_task,
                                declare_exec_ms=kind.declare_exec_ms,
                                batched={n: t for (d, n), t in batched_nodes.items()
                                         if d == name})
            for name, s in workload.dags.items()}


def exited_workers(provider: LocalProvider) -> dict[str, int | None]:
    """The workers the provider still runs whose process has already exited (name -> exit
    code): nobody drained them, so what they held and what went to the shared queue
    since (no live worker known) waits for a worker that is gone."""
    out: dict[str, int | None] = {}
    for name in provider.names():
        proc = provider.process(name)
        if not proc.alive():
            out[name] = proc.proc.returncode if proc.proc is not None else None
    return out


def run_autoscaled(workload: Workload, trace: Trace, opts: BenchOptions, *, seed: int = 0,
                   cold_start_s: float = scaling.COLD_START_S,
                   poll_s: float = scaling.KEDA_POLL_S, log_dir: str | None = None,
                   echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """The trace on real workers under the controller, audited; with the simulator's
    compass-plan on the same trace, arrivals and settings (``sim``). The workers log to
    ``log_dir`` (None: a temporary folder, removed)."""
    import redis as redis_lib

    c, kind = trace.compression, worker_kind(opts)
    spec = workload.cluster.workers[0]
    stream = scaling._stream(workload, trace.times_ms(seed), seed)
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="compass-as-"))
        os.makedirs(log_dir, exist_ok=True)
        server = stack.enter_context(RedisServer())
        url = server.url
        client = redis_lib.Redis.from_url(url)
        _forget_previous_run(client, client, PREFIX)
        batched, batched_nodes = batched_tasks(workload.dags, kind.namespace)
        app = _bench_app(workload, "compass", PREFIX, url, url, opts, [], batched)
        env = _worker_env(workload, "compass", PREFIX, url, url, None, opts)
        provider = stack.enter_context(LocalProvider(
            kind.module, args=kind.worker_args(spec, opts.time_scale), env=env,
            prefix="as", host="compass", stop_timeout_s=120.0, log_dir=log_dir))
        hb = app.compass.settings.heartbeat_timeout_s
        t0 = [time.monotonic()]
        scaler = Autoscaler(
            provider, workload, lambda: app.compass.reader.store.snapshot(time.time(), hb).workers,
            window_s=scaling.PLAN_WINDOW_S / c, down_window_s=scaling.KEDA_DOWN_S / c,
            horizon_s=cold_start_s / c, gpu_mb=spec.gpu_mem_mb,
            clock=lambda: (time.monotonic() - t0[0]) / opts.time_scale,
            arrivals=ArrivalCounter(client, PREFIX), time_scale=opts.time_scale)
        _initial(scaler, workload, trace.rate(0.0), spec.gpu_mem_mb)
        first = provider.names()
        wait_until(lambda: len(scaler.members()) == len(first) and not scaler.hints, 120,
                   "the first workers")
        initial = {n: scaler.first_seen.pop(n) for n in first}
        t0[0] = time.monotonic()
        scaler.read_arrivals()  # the first tick reads from here (a poll reads from its last)
        scaler.since.update({n: 0.0 for n in first})
        dags = _dags(app, workload, kind, batched_nodes)
        clock = lambda: (time.monotonic() - t0[0]) * 1000.0 / opts.time_scale  # noqa: E731
        waiter = _Waiter(redis_lib.Redis.from_url(url), clock)
        waiter.start()
        stack.callback(waiter.stopping.set)
        stop = threading.Event()
        ticker = _ticker(scaler, poll_s / c, trace.duration_s, stop, opts.time_scale)
        sent = _send_stream(stream, dags, t0[0], clock, waiter, opts, "autoscale", echo,
                            lambda: 0, workload)
        _wait_for_jobs(sent, waiter, clock, opts, "autoscale", echo)
        stop.set()
        ticker.join()
        # billed to the trace's end at least, as the simulator bills
        time.sleep(max(trace.duration_s - scaler.clock(), 0.0) * opts.time_scale)
        worker_s = scaler.close()
        scaler.read_arrivals()  # the last ones, for the count against what was sent
        time.sleep(opts.settle_s)
        stranded = stranded_messages(client, PREFIX, provider.names())
        exited = exited_workers(provider)
        result = _measured(sent, workload, stream, opts, (0, 0, 0))
        provider.close()
        result.update(_delivery_counts(client, client, PREFIX, stranded))
        _check_logs(log_dir, {**initial, **scaler.first_seen})
    sim = scaling.run(workload, "compass-plan", scaling.Setup(
        trace, cold_start_s=cold_start_s, poll_s=poll_s, readings=True), seed)
    return {"trace": trace.name, "duration_s": trace.duration_s, "peak": trace.peak_per_s,
            "compression": c, "seed": seed, "jobs": len(stream),
            "worker_s": round(worker_s, 1), "sim_worker_s": sim["worker_s"],
            "ratio": round(worker_s / sim["worker_s"], 3) if sim["worker_s"] else None,
            "arrivals_counted": dict(sorted(scaler.counted.items())),
            "added": scaler.first_seen, "initial": initial, "exited": exited,
            "decisions": scaler.decisions, "sim_timeline": sim["timeline"],
            "readings": scaler.readings, "sim_readings": sim["readings"],
            "sim_slo": sim["slo"]["all"], "result": result}
