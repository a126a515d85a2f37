"""The real-cluster benchmark: a Redis-backed Celery cluster of emulated-GPU workers.

For each policy in turn: empty the state, start one ``celery worker`` process
per emulated GPU of the workload's cluster, replay the same seeded open-loop
arrivals through the job runtime, wait for every job, read the workers' cache
counters, stop the workers. Latency is taken by this (submitting) process from
submission to the job's completion, and reported in workload ms (real time
divided by the time scale).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import keys
from ..local import RedisServer, WorkerProcess, wait_until
from ..workload import WorkerSpec, Workload, job_stream
from .stats import JobOutcome, latency_summary, policy_result

POLICIES = ["celery-default", "round-robin", "random", "jsq", "hash", "heft", "compass"]


@dataclass
class BenchOptions:
    policies: Sequence[str] = tuple(POLICIES)
    rate: float | None = None
    jobs: int | None = None
    time_scale: float = 0.5
    warmup_frac: float = 0.1
    redis_url: str | None = None
    workers: int | None = None
    kill_worker_after: float | None = None
    restart_redis_after: float | None = None
    drain_timeout_s: float = 90.0
    # Redis transport visibility timeout for the workers (real s): how soon plain Celery
    # redelivers a dead worker's unacked task; the same for every policy.
    visibility_timeout_s: float = 60.0
    # Workers' eviction policy; None = LRU for celery-default (plain Celery), else lookahead.
    cache_policy: str | None = None
    progress: bool = True
    log_dir: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


class _Waiter(threading.Thread):
    """Records when each job's done list receives its outcome (one BLPOP over many keys)."""

    def __init__(self, client: Any, clock: Callable[[], float]) -> None:
        super().__init__(daemon=True, name="compass-bench-waiter")
        self.client, self.clock = client, clock
        self.pending: dict[bytes, JobOutcome] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def watch(self, key: str, outcome: JobOutcome) -> None:
        with self.lock:
            self.pending[key.encode()] = outcome

    def run(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                keys = list(self.pending)[:1000]
            if not keys:
                time.sleep(0.005)
                continue
            try:
                popped = self.client.blpop(keys, timeout=0.2)
            except Exception:  # Redis restarting: keep waiting, the drain timeout decides
                time.sleep(0.2)
                continue
            if popped is None:
                continue
            now = self.clock()
            with self.lock:
                outcome = self.pending.pop(popped[0], None)
            if outcome is not None:
                outcome.end_ms = now
                outcome.failed = popped[1] == b"FAILURE"


def _worker_args(spec: WorkerSpec, scale: float) -> list[str]:
    return ["--compass-emulate-gpu-mb", str(spec.gpu_mem_mb),
            "--compass-load-mb-per-s", str(spec.load_mb_per_s),
            "--compass-speed", str(spec.speed), "--compass-time-scale", str(scale),
            "--compass-emulate-host-mb", str(spec.host_mem_mb)]


def run_policy(workload: Workload, policy: str, redis_url: str, opts: BenchOptions,
               echo: Callable[[str], Any], restart: Callable[[], None] | None = None
               ) -> dict[str, Any]:
    """One policy, one fresh cluster, the whole job stream."""
    import redis as redis_lib

    from workers.emulated import make_app

    from ..dag import Dag

    prefix = f"compass-bench-{policy}"
    client = redis_lib.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{prefix}*"):  # state, jobs and queues of a previous run
        client.delete(key)
    specs = (workload.cluster.workers if opts.workers is None
             else workload.cluster.scaled(opts.workers).workers)
    env = {"COMPASS_BROKER_URL": redis_url, "COMPASS_MODELS": json.dumps(workload.models),
           "COMPASS_POLICY": policy, "COMPASS_KEY_PREFIX": prefix,
           "COMPASS_SHARED_QUEUE": f"{prefix}.shared", "COMPASS_QUEUE_PREFIX": f"{prefix}.w.",
           "COMPASS_CACHE_POLICY": opts.cache_policy or (
               "lru" if policy == "celery-default" else "lookahead"),
           "COMPASS_TIME_SCALE": str(opts.time_scale),
           "COMPASS_VISIBILITY_TIMEOUT": str(opts.visibility_timeout_s), **opts.extra_env}
    app = make_app(redis_url, compass_policy=policy, compass_key_prefix=prefix,
                   compass_shared_queue=f"{prefix}.shared",
                   compass_queue_prefix=f"{prefix}.w.", compass_time_scale=opts.time_scale,
                   compass_models=dict(workload.models), compass_job_timeout_s=3600)
    log_dir = opts.log_dir or os.path.join(os.getcwd(), "bench-out", "logs")
    os.makedirs(log_dir, exist_ok=True)
    workers = [WorkerProcess("workers.emulated", f"{s.name}@{policy}",
                             _worker_args(s, opts.time_scale), env=env,
                             log_path=os.path.join(log_dir, f"{policy}-{s.name}.log"))
               for s in specs]
    with contextlib.ExitStack() as stack:
        for w in workers:
            stack.callback(w.stop)
            w.start()
        try:
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5.0).workers)
                       == len(workers), 90, f"{len(workers)} {policy} workers")
        except TimeoutError:
            raise RuntimeError(f"workers did not start; logs in {log_dir}") from None
        dags = {name: Dag.from_spec(app, spec) for name, spec in workload.dags.items()}
        stream = job_stream(workload, rate=opts.rate, jobs=opts.jobs)
        t0 = time.monotonic()
        clock = lambda: (time.monotonic() - t0) * 1000.0 / opts.time_scale  # noqa: E731
        waiter = _Waiter(redis_lib.Redis.from_url(redis_url), clock)
        waiter.start()
        stack.callback(waiter.stopping.set)
        _schedule_faults(opts, workers, restart, stack)
        outcomes: list[JobOutcome] = []
        handles = []
        for i, (at_ms, name) in enumerate(stream):
            delay = t0 + at_ms * opts.time_scale / 1000.0 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            outcome = JobOutcome(i, name, clock())
            try:
                handle = dags[name].apply_async()
            except Exception as exc:  # a failed submission is a failed job, never a lost one
                echo(f"  job {i} ({name}) failed at submission: {exc}")
                outcome.end_ms, outcome.failed = clock(), True
                outcomes.append(outcome)
                continue
            waiter.watch(handle.keys.done, outcome)
            outcomes.append(outcome)
            handles.append((outcome, handle))
            _progress(opts, policy, i + 1, len(stream), outcomes)
        deadline = time.monotonic() + opts.drain_timeout_s
        while any(o.end_ms is None for o in outcomes) and time.monotonic() < deadline:
            _progress(opts, policy, len(stream), len(stream), outcomes)
            time.sleep(0.1)
        waiter.stopping.set()
        if opts.progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        _settle_unfinished(handles, clock, echo)
        hits, misses, loads = _cache_counters(client, prefix)
        result = policy_result(outcomes, opts.warmup_frac, hits, misses, loads)
        result["breakdown_ms"] = _breakdown(handles, opts.warmup_frac, len(stream))
        result["latencies_ms"] = [round(o.end_ms - o.arrival_ms, 3) for o in outcomes
                                  if o.end_ms is not None and not o.failed
                                  and o.index >= int(len(outcomes) * opts.warmup_frac)]
    return result


def _settle_unfinished(handles: list[tuple[JobOutcome, Any]], clock: Callable[[], float],
                       echo: Callable[[str], Any]) -> None:
    """A job whose record vanished (Redis restarted without persistence) failed with a
    clear error; only a job still RUNNING after the drain timeout counts as lost."""
    gone = 0
    for outcome, handle in handles:
        if outcome.end_ms is not None:
            continue
        try:
            status = handle.status
        except Exception:
            continue
        if status == "UNKNOWN":
            outcome.end_ms, outcome.failed = clock(), True
            gone += 1
        elif status in ("SUCCESS", "FAILURE"):
            outcome.end_ms, outcome.failed = clock(), status == "FAILURE"
    if gone:
        echo(f"  {gone} job(s) failed: their records were lost from Redis (no persistence)")


def _progress(opts: BenchOptions, policy: str, sent: int, total: int,
              outcomes: list[JobOutcome]) -> None:
    if not opts.progress or not sys.stderr.isatty():
        return
    done = sum(1 for o in outcomes if o.end_ms is not None)
    bar = "#" * int(30 * done / max(total, 1))
    sys.stderr.write(f"\r  {policy:<15} [{bar:<30}] sent {sent}/{total} done {done}   ")
    sys.stderr.flush()


def _schedule_faults(opts: BenchOptions, workers: list[WorkerProcess],
                     restart: Callable[[], None] | None, stack: contextlib.ExitStack) -> None:
    timers = []
    if opts.kill_worker_after is not None:
        timers.append(threading.Timer(opts.kill_worker_after,
                                      lambda: workers[0].kill(signal.SIGKILL)))
    if opts.restart_redis_after is not None:
        if restart is None:
            raise ValueError("--restart-redis-after needs the private Redis (no --redis)")
        timers.append(threading.Timer(opts.restart_redis_after, restart))
    for t in timers:
        t.daemon = True
        t.start()
        stack.callback(t.cancel)


def _cache_counters(client: Any, prefix: str) -> tuple[int, int, int]:
    hits = misses = loads = 0
    for raw in client.hgetall(keys.key(keys.WORKERS, prefix)).values():
        try:
            rec = json.loads(raw)
            hits, misses, loads = (hits + int(rec.get("hits", 0)),
                                   misses + int(rec.get("misses", 0)),
                                   loads + int(rec.get("loads", 0)))
        except (ValueError, TypeError):
            continue
    return hits, misses, loads


def _breakdown(handles: list[tuple[JobOutcome, Any]], warmup_frac: float,
               total: int) -> dict[str, float]:
    """Mean per-task queue wait, model load and run time (workload ms), after warm-up."""
    sums = {"queued_ms": 0.0, "load_ms": 0.0, "run_ms": 0.0}
    n = 0
    skip = int(total * warmup_frac)
    for outcome, handle in handles:
        if outcome.index < skip or outcome.failed or outcome.end_ms is None:
            continue
        try:
            nodes = handle.placement()
        except Exception:
            continue
        for info in nodes.values():
            if "run_ms" in info:
                n += 1
                for k in sums:
                    sums[k] += float(info.get(k, 0.0))
    return {k: round(v / n, 3) if n else 0.0 for k, v in sums.items()}


def run_bench(workload: Workload, opts: BenchOptions,
              echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Every policy on the same cluster shape, arrivals and cache sizes, in one run."""
    started = time.time()
    with contextlib.ExitStack() as stack:
        server = None
        url = opts.redis_url
        if url is None:
            server = stack.enter_context(RedisServer())
            url = server.url
        else:
            import redis as redis_lib

            try:
                redis_lib.Redis.from_url(url, socket_connect_timeout=2).ping()
            except Exception as exc:
                raise ConnectionError(f"cannot reach Redis at {url}: {exc}") from None
        results = {}
        for policy in opts.policies:
            echo(f"policy {policy}: starting {len(workload.cluster.workers) if opts.workers is None else opts.workers} emulated-GPU workers")  # noqa: E501
            results[policy] = run_policy(workload, policy, url, opts, echo,
                                         restart=server.restart if server else None)
            lat = results[policy]["latency_ms"]
            echo(f"  mean {lat['mean']:.1f} ms, p99 {lat['p99']:.1f} ms, "
                 f"completed {results[policy]['completed']}/{results[policy]['jobs']}")
    return {"workload": workload.name, "time_scale": opts.time_scale, "emulated_gpu": True,
            "rate_per_s": opts.rate or workload.arrivals.rate_per_s,
            "wall_s": round(time.time() - started, 1), "policies": results}


__all__ = ["POLICIES", "BenchOptions", "latency_summary", "run_bench", "run_policy"]
