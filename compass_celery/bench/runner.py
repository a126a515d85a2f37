"""The real-cluster benchmark: a Redis-backed Celery cluster of emulated-GPU workers.

For each policy in turn: empty the state, start one ``celery worker`` process
per emulated GPU of the workload's cluster, replay the same seeded open-loop
arrivals through the job runtime, wait for every job, read the workers' cache
counters, stop the workers. Latency is taken by this (submitting) process from
submission to the job's completion, and reported in workload ms (real time
divided by the time scale).

Faults (each usable with every policy) are injected while the jobs arrive, and
the result counts what the delivery contract promises: ``duplicates``
(executions beyond the first, from a ledger in a second private Redis that no
fault touches) and ``stranded`` (messages left in a queue, a staging list or
kombu's unacked hash once every job ended).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import keys
from ..local import LocalRedisError, RedisServer, WorkerProcess, wait_until
from ..transport import RedisLayout
from ..workload import WorkerSpec, Workload, job_stream
from .stats import JobOutcome, duplicate_count, duplicated_ids, latency_summary, policy_result

#: Put first on a worker's PYTHONPATH to skew its wall clock (COMPASS_CLOCK_SKEW_S).
CLOCKSKEW_DIR = str(Path(__file__).resolve().parent / "clockskew")

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
    # Faults, all in real seconds; None = off. See the ``bench`` command's --help.
    rolling_restart_after: float | None = None
    pause_redis_after: float | None = None
    pause_redis_for: float | None = None      # None = 2x heartbeat_timeout_s
    skew_clock_s: float | None = None         # one worker's wall clock this far ahead
    long_task_s: float | None = None          # one extra job of one task this long
    redis_aof: bool = False                   # the private Redis appends to an AOF
    drain_timeout_s: float = 90.0
    # Redis transport visibility timeout for the workers (real s): how soon plain Celery
    # redelivers a dead worker's unacked task; the same for every policy. With
    # long_task_s it is lowered to half the long task, so that task outlives it.
    visibility_timeout_s: float = 60.0
    # Workers' heartbeat timeout (real s): short, so that faults resolve in seconds.
    heartbeat_timeout_s: float = 3.0
    # After the last job ended, wait this long for acks before counting stranded messages.
    settle_s: float = 1.0
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


def effective_visibility_s(opts: BenchOptions) -> float:
    """The workers' visibility timeout: a long task must outlive it, or it tests nothing."""
    if opts.long_task_s is not None:
        return min(opts.visibility_timeout_s, opts.long_task_s / 2.0)
    return opts.visibility_timeout_s


def run_policy(workload: Workload, policy: str, redis_url: str, opts: BenchOptions,
               echo: Callable[[str], Any], restart: Callable[[], None] | None = None,
               server: RedisServer | None = None, ledger_url: str | None = None
               ) -> dict[str, Any]:
    """One policy, one fresh cluster, the whole job stream."""
    import redis as redis_lib

    from ..dag import Dag
    from ..emulated import EXEC_STARTS, EXECS, INFER_TASK, STEP_TASK, make_app

    if server is not None and restart is None:
        restart = server.restart
    prefix = f"compass-bench-{policy}"
    client = redis_lib.Redis.from_url(redis_url)
    ledger = redis_lib.Redis.from_url(ledger_url or redis_url)
    for key in client.scan_iter(f"{prefix}*"):  # state, jobs and queues of a previous run
        client.delete(key)
    ledger.delete(keys.key(EXECS, prefix), keys.key(EXEC_STARTS, prefix))
    _forget_unacked(client, prefix)
    specs = (workload.cluster.workers if opts.workers is None
             else workload.cluster.scaled(opts.workers).workers)
    env = {"COMPASS_BROKER_URL": redis_url, "COMPASS_MODELS": json.dumps(workload.models),
           "COMPASS_POLICY": policy, "COMPASS_KEY_PREFIX": prefix,
           "COMPASS_SHARED_QUEUE": f"{prefix}.shared", "COMPASS_QUEUE_PREFIX": f"{prefix}.w.",
           "COMPASS_CACHE_POLICY": opts.cache_policy or (
               "lru" if policy == "celery-default" else "lookahead"),
           "COMPASS_TIME_SCALE": str(opts.time_scale),
           "COMPASS_HEARTBEAT_TIMEOUT_S": str(opts.heartbeat_timeout_s),
           "COMPASS_BENCH_LEDGER_URL": ledger_url or redis_url,
           # kombu sweeps expired unacked messages every 1 s, not every 100 s, so plain
           # Celery's redelivery after the visibility timeout shows within a run
           "COMPASS_RESTORE_INTERVAL_S": "1",
           "COMPASS_VISIBILITY_TIMEOUT": str(effective_visibility_s(opts)), **opts.extra_env}
    app = make_app(redis_url, compass_policy=policy, compass_key_prefix=prefix,
                   compass_shared_queue=f"{prefix}.shared",
                   compass_queue_prefix=f"{prefix}.w.", compass_time_scale=opts.time_scale,
                   compass_heartbeat_timeout_s=opts.heartbeat_timeout_s,
                   compass_models=dict(workload.models), compass_job_timeout_s=3600)
    log_dir = opts.log_dir or os.path.join(os.getcwd(), "bench-out", "logs")
    os.makedirs(log_dir, exist_ok=True)
    workers = []
    for i, s in enumerate(specs):
        wenv = dict(env)
        if opts.skew_clock_s and i == 0:  # one worker's wall clock runs ahead
            wenv["PYTHONPATH"] = os.pathsep.join(
                [CLOCKSKEW_DIR, os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])
            wenv["COMPASS_CLOCK_SKEW_S"] = str(opts.skew_clock_s)
        workers.append(WorkerProcess("compass_celery.emulated_app", f"{s.name}@{policy}",
                                     _worker_args(s, opts.time_scale), env=wenv,
                                     log_path=os.path.join(log_dir, f"{policy}-{s.name}.log")))
    faults: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for w in workers:
            stack.callback(w.stop)
            w.start()
        try:
            wait_until(lambda: len(_live(app)) == len(workers), 90,
                       f"{len(workers)} {policy} workers")
        except TimeoutError:
            raise RuntimeError(f"workers did not start; logs in {log_dir}") from None
        dags = {name: Dag.from_spec(app, spec, task=INFER_TASK, step_task=STEP_TASK)
                for name, spec in workload.dags.items()}
        if opts.long_task_s is not None:
            dags["long-task"] = _long_task_dag(app, workload, opts)
        stream = job_stream(workload, rate=opts.rate, jobs=opts.jobs)
        if opts.long_task_s is not None:  # first, so that it is warm-up for the latencies
            stream = [(0.0, "long-task"), *stream]
        t0 = time.monotonic()
        clock = lambda: (time.monotonic() - t0) * 1000.0 / opts.time_scale  # noqa: E731
        waiter = _Waiter(redis_lib.Redis.from_url(redis_url), clock)
        waiter.start()
        stack.callback(waiter.stopping.set)
        _schedule_faults(opts, workers, restart, stack, server=server, app=app,
                         log_dir=log_dir, policy=policy, events=faults, t0=t0)
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
        next_settle = time.monotonic() + 5.0
        gone = 0
        while any(o.end_ms is None for o in outcomes) and time.monotonic() < deadline:
            _progress(opts, policy, len(stream), len(stream), outcomes)
            if opts.restart_redis_after is not None and time.monotonic() > next_settle:
                # records gone with a restart: those jobs failed, no need to wait for them
                gone += _settle_unfinished(handles, clock, echo, quiet=True)
                next_settle = time.monotonic() + 5.0
            time.sleep(0.1)
        waiter.stopping.set()
        if opts.progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        gone += _settle_unfinished(handles, clock, echo, quiet=True)
        if gone:
            echo(f"  {gone} job(s) failed: their records were lost from Redis (no persistence)")
        time.sleep(opts.settle_s)  # the last acks land before anything counts as stranded
        stranded = stranded_messages(client, prefix, [w.name for w in workers])
        hits, misses, loads = _cache_counters(client, prefix)
        result = policy_result(outcomes, opts.warmup_frac, hits, misses, loads)
        result["breakdown_ms"] = _breakdown(handles, opts.warmup_frac, len(stream))
        result["latencies_ms"] = [round(o.end_ms - o.arrival_ms, 3) for o in outcomes
                                  if o.end_ms is not None and not o.failed
                                  and o.index >= int(len(outcomes) * opts.warmup_frac)]
    # counted once the workers stopped: nothing can run again behind the count's back
    finished = _ledger_counts(ledger, keys.key(EXECS, prefix))
    started = _ledger_counts(ledger, keys.key(EXEC_STARTS, prefix))
    result["duplicates"] = duplicate_count(finished)
    result["duplicate_starts"] = duplicate_count(started)
    result["executions"] = sum(finished.values())
    result["duplicated_task_ids"] = duplicated_ids(started)
    result["stranded"] = sum(stranded.values())
    result["stranded_where"] = {k: v for k, v in stranded.items() if v}
    result["dead_lettered"] = int(client.llen(keys.key(keys.DEAD_LETTER, prefix)))
    result["faults"] = faults
    return result


def _live(app: Any) -> set[str]:
    """Names of the workers whose records the submitting process sees as live."""
    return {w.name for w in app.compass.store.snapshot(time.time(), 5.0).workers}


def _long_task_dag(app: Any, workload: Workload, opts: BenchOptions) -> Any:
    """One node on the workload's smallest model that runs ``long_task_s`` real seconds."""
    from ..dag import Dag
    from ..emulated import INFER_TASK

    assert opts.long_task_s is not None
    model = min(workload.models, key=lambda m: workload.models[m])
    exec_ms = opts.long_task_s * 1000.0 / opts.time_scale  # workload ms
    dag = Dag(app, "long-task")
    dag.node("long", app.signature(INFER_TASK, args=(model, exec_ms, None)),
             model=model, exec_ms=exec_ms)
    return dag


def _ledger_counts(ledger: Any, key: str) -> dict[str, int]:
    return {(k.decode() if isinstance(k, bytes) else k): int(v)
            for k, v in ledger.hgetall(key).items()}


def _owned(routing_key: str, prefix: str) -> bool:
    return routing_key.startswith((f"{prefix}.w.", f"{prefix}.shared"))


def _unacked_entries(client: Any, prefix: str) -> list[bytes]:
    """Delivery tags of kombu ``unacked`` entries routed to this run's queues."""
    layout = RedisLayout()
    tags = []
    for tag, raw in client.hgetall(layout.keyprefix + layout.unacked).items():
        try:
            _, _, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if isinstance(routing_key, str) and _owned(routing_key, prefix):
            tags.append(tag)
    return tags


def _forget_unacked(client: Any, prefix: str) -> None:
    """A previous run's in-flight entries of these queues would count as stranded."""
    layout = RedisLayout()
    tags = _unacked_entries(client, prefix)
    if tags:
        client.hdel(layout.keyprefix + layout.unacked, *tags)
        client.zrem(layout.keyprefix + layout.unacked_index, *tags)


def stranded_messages(client: Any, prefix: str, worker_names: Sequence[str]
                      ) -> dict[str, int]:
    """Messages still waiting anywhere once every job ended: each worker queue and the
    shared queue (every priority list), each staging list, and kombu's unacked hash."""
    layout = RedisLayout()
    queues = {f"{prefix}.shared", *(f"{prefix}.w.{n}" for n in worker_names)}
    for raw in client.scan_iter(f"{prefix}.w.*"):  # queues of names not in this cluster
        name = raw.decode("utf-8", "replace")
        queues.add(name.split(layout.sep)[0])
    out: dict[str, int] = {}
    for queue in sorted(queues):
        for name in layout.lists(queue):
            out[name.replace(layout.sep, "/")] = int(client.llen(name))
    for raw in client.scan_iter(keys.key(keys.STAGING, prefix, queue="*")):
        out[raw.decode("utf-8", "replace")] = int(client.llen(raw))
    out["unacked"] = len(_unacked_entries(client, prefix))
    return out


def _settle_unfinished(handles: list[tuple[JobOutcome, Any]], clock: Callable[[], float],
                       echo: Callable[[str], Any], quiet: bool = False) -> int:
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
    if gone and not quiet:
        echo(f"  {gone} job(s) failed: their records were lost from Redis (no persistence)")
    return gone


def _progress(opts: BenchOptions, policy: str, sent: int, total: int,
              outcomes: list[JobOutcome]) -> None:
    if not opts.progress or not sys.stderr.isatty():
        return
    done = sum(1 for o in outcomes if o.end_ms is not None)
    bar = "#" * int(30 * done / max(total, 1))
    sys.stderr.write(f"\r  {policy:<15} [{bar:<30}] sent {sent}/{total} done {done}   ")
    sys.stderr.flush()


def _schedule_faults(opts: BenchOptions, workers: list[WorkerProcess],
                     restart: Callable[[], None] | None, stack: contextlib.ExitStack, *,
                     server: RedisServer | None = None, app: Any = None,
                     log_dir: str = ".", policy: str = "", events: list[dict[str, Any]]
                     | None = None, t0: float | None = None) -> None:
    """Start each requested fault on its own thread; the stack stops and joins them
    before the workers stop. ``events`` receives what each fault did, and when."""
    events = events if events is not None else []
    t0 = time.monotonic() if t0 is None else t0
    stopping = threading.Event()
    at = lambda: round(time.monotonic() - t0, 2)  # noqa: E731
    jobs: list[tuple[float, Callable[[], None]]] = []

    def kill() -> None:
        workers[0].kill(signal.SIGKILL)
        events.append({"fault": "sigkill", "worker": workers[0].name, "at_s": at()})

    def restart_redis() -> None:
        assert restart is not None
        t = at()
        restart()
        events.append({"fault": "restart-redis", "aof": opts.redis_aof, "at_s": t,
                       "back_at_s": at()})

    def pause_redis() -> None:
        assert server is not None and server.proc is not None
        pid = server.proc.pid
        span = opts.pause_redis_for if opts.pause_redis_for is not None \
            else 2 * opts.heartbeat_timeout_s
        t = at()
        os.kill(pid, signal.SIGSTOP)
        try:
            stopping.wait(span)
        finally:
            os.kill(pid, signal.SIGCONT)
        events.append({"fault": "pause-redis", "at_s": t, "for_s": span, "back_at_s": at()})

    def rolling_restart() -> None:
        for n, w in enumerate(workers):
            if stopping.is_set():
                return
            events.append(_restart_worker(w, app, log_dir, policy, n, at, stopping))

    if opts.kill_worker_after is not None:
        jobs.append((opts.kill_worker_after, kill))
    if opts.restart_redis_after is not None:
        if restart is None:
            raise ValueError("--restart-redis-after needs the private Redis (no --redis)")
        jobs.append((opts.restart_redis_after, restart_redis))
    if opts.pause_redis_after is not None:
        if server is None:
            raise ValueError("--pause-redis-after needs the private Redis (no --redis)")
        jobs.append((opts.pause_redis_after, pause_redis))
    if opts.rolling_restart_after is not None:
        jobs.append((opts.rolling_restart_after, rolling_restart))
    threads = []
    for delay, fn in jobs:
        def body(delay: float = delay, fn: Callable[[], None] = fn) -> None:
            if not stopping.wait(max(0.0, t0 + delay - time.monotonic())):
                fn()
        th = threading.Thread(target=body, daemon=True, name=f"compass-bench-{fn.__name__}")
        th.start()
        threads.append(th)

    def join() -> None:
        stopping.set()
        for th in threads:
            th.join(120)
    stack.callback(join)


def _restart_worker(w: WorkerProcess, app: Any, log_dir: str, policy: str, n: int,
                    at: Callable[[], float], stopping: threading.Event) -> dict[str, Any]:
    """SIGTERM (a warm shutdown, as a deploy sends), wait for a clean exit, start the
    same name again, and wait until its record is live before the next worker goes."""
    event: dict[str, Any] = {"fault": "rolling-restart", "worker": w.name, "at_s": at()}
    w.kill(signal.SIGTERM)
    assert w.proc is not None
    try:
        event["exit_code"] = w.proc.wait(60)
    except subprocess.TimeoutExpired:
        w.kill(signal.SIGKILL)
        event["exit_code"] = w.proc.wait()
        event["note"] = "no exit 60 s after SIGTERM: SIGKILLed"
    event["exited_at_s"] = at()
    old_log = w.log_path
    w.log_path = os.path.join(log_dir, f"{policy}-{w.name.split('@')[0]}.restart{n}.log")
    event["logs"] = [os.path.basename(old_log), os.path.basename(w.log_path)]
    if stopping.is_set():
        return event
    w.start()
    try:
        wait_until(lambda: stopping.is_set() or w.name in _live(app), 90,
                   f"{w.name} back after restart", interval=0.1)
        event["live_at_s"] = at()
    except TimeoutError as exc:
        event["note"] = str(exc)
    return event


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


def _private_redis(stack: contextlib.ExitStack, args: Sequence[str] = ()) -> RedisServer:
    return stack.enter_context(RedisServer(args=args))


def run_bench(workload: Workload, opts: BenchOptions,
              echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Every policy on the same cluster shape, arrivals and cache sizes, in one run."""
    started = time.time()
    with contextlib.ExitStack() as stack:
        server = None
        url = opts.redis_url
        if url is None:
            # appendonly given last overrides RedisServer's own "--appendonly no"
            server = _private_redis(stack, ["--appendonly", "yes"] if opts.redis_aof else [])
            url = server.url
        else:
            import redis as redis_lib

            try:
                redis_lib.Redis.from_url(url, socket_connect_timeout=2).ping()
            except Exception as exc:
                raise ConnectionError(f"cannot reach Redis at {url}: {exc}") from None
        try:  # the execution ledger lives apart, where no Redis fault reaches it
            ledger_url = _private_redis(stack).url
        except LocalRedisError:
            ledger_url = url
        results = {}
        for policy in opts.policies:
            echo(f"policy {policy}: starting {len(workload.cluster.workers) if opts.workers is None else opts.workers} emulated-GPU workers")  # noqa: E501
            results[policy] = run_policy(workload, policy, url, opts, echo, server=server,
                                         ledger_url=ledger_url)
            r = results[policy]
            lat = r["latency_ms"]
            echo(f"  mean {lat['mean']:.1f} ms, p99 {lat['p99']:.1f} ms, "
                 f"completed {r['completed']}/{r['jobs']}, duplicates {r['duplicates']}, "
                 f"stranded {r['stranded']}")
    return {"workload": workload.name, "time_scale": opts.time_scale, "emulated_gpu": True,
            "rate_per_s": opts.rate or workload.arrivals.rate_per_s,
            "heartbeat_timeout_s": opts.heartbeat_timeout_s,
            "visibility_timeout_s": effective_visibility_s(opts),
            "wall_s": round(time.time() - started, 1), "policies": results}


__all__ = ["POLICIES", "BenchOptions", "latency_summary", "run_bench", "run_policy",
           "stranded_messages"]
