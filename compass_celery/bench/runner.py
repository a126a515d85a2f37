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
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..broker.amqp import is_amqp
from ..emulated import BATCHED_ENV, BENCH_BATCHES, batched_tasks
from ..local import LocalRedisError, RedisServer, WorkerProcess, wait_until
from ..planner import EXPIRES
from ..results import (
    JobOutcome,
    duplicate_count,
    duplicated_ids,
    job_records,
    latency_summary,
    left_capacity_share,
    policy_result,
    window_batch_share,
)
from ..state import keys
from ..state.urls import masked
from ..workload import WorkerSpec, Workload, job_stream
from .audit import forget_unacked, ledger_counts, stranded_amqp, stranded_messages
from .batches import read_batches
from .faults import live_workers, schedule_faults
from .hostload import HostLoad, host_line
from .kinds import EMULATED, REAL, WorkerKind
from .options import POLICIES, BenchOptions, planner_policy
from .slo import expiring_dag, read_records, submit, task_runs
from .terms import hop_gaps, hop_ms, job_rows, load_outcomes, node_rows, term_errors

#: Put first on a worker's PYTHONPATH to skew its wall clock (COMPASS_CLOCK_SKEW_S).
CLOCKSKEW_DIR = str(Path(__file__).resolve().parent / "clockskew")

class _Waiter(threading.Thread):
    """Records when each job's done list receives its outcome (one BLPOP over many keys).

    A job watched while the BLPOP blocks on the keys it started with wakes it (a push to
    the waiter's own wake list, among those keys): otherwise a job that ended before any
    job watched earlier would be seen only at the BLPOP's timeout, up to 0.2 s late."""

    def __init__(self, client: Any, clock: Callable[[], float]) -> None:
        super().__init__(daemon=True, name="compass-bench-waiter")
        self.client, self.clock = client, clock
        self.pending: dict[bytes, JobOutcome] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.wake = f"compass-bench-wake:{uuid.uuid4().hex}".encode()

    def watch(self, key: str, outcome: JobOutcome) -> None:
        with self.lock:
            self.pending[key.encode()] = outcome
        with contextlib.suppress(Exception):  # Redis restarting: the timeout still sees it
            self.client.rpush(self.wake, b"1")

    def run(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                keys = list(self.pending)[:1000]
            if not keys:
                time.sleep(0.005)
                continue
            try:
                popped = self.client.blpop([self.wake, *keys], timeout=0.2)
                if popped is not None and popped[0] == self.wake:
                    self.client.delete(self.wake)  # what was watched is in keys next time
                    continue
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


def worker_kind(opts: BenchOptions) -> WorkerKind:
    """Real models on the CPU, or emulated GPUs."""
    return REAL if opts.real else EMULATED


def effective_visibility_s(opts: BenchOptions) -> float:
    """The workers' visibility timeout: a long task must outlive it, or it tests nothing."""
    if opts.long_task_s is not None:
        return min(opts.visibility_timeout_s, opts.long_task_s / 2.0)
    return opts.visibility_timeout_s


def run_policy(workload: Workload, policy: str, redis_url: str, opts: BenchOptions,
               echo: Callable[[str], Any], restart: Callable[[], None] | None = None,
               server: RedisServer | None = None, ledger_url: str | None = None,
               rig: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """One policy, one fresh cluster, the whole job stream (``rig``: the processes
    besides the workers and this one whose CPU the host figures count, by role)."""
    import redis as redis_lib

    from ..jobs.dag import Dag

    kind = worker_kind(opts)
    if server is not None and restart is None:
        restart = server.restart
    prefix = f"compass-bench-{policy}"
    broker = opts.broker_url or redis_url
    client = redis_lib.Redis.from_url(redis_url)
    ledger = redis_lib.Redis.from_url(ledger_url or redis_url)
    _forget_previous_run(client, ledger, prefix)
    specs = (workload.cluster.workers if opts.workers is None
             else workload.cluster.scaled(opts.workers).workers)
    names = [f"{s.name}@{policy}" for s in specs]
    batched, batched_nodes = batched_tasks(workload.dags, kind.namespace)
    app = _bench_app(workload, policy, prefix, broker, redis_url, opts, names, batched)
    env = _worker_env(workload, policy, prefix, broker, redis_url, ledger_url, opts)
    if batched:
        env[BATCHED_ENV] = json.dumps(batched)
    log_dir = opts.log_dir or os.path.join(os.getcwd(), "bench-out", "logs")
    os.makedirs(log_dir, exist_ok=True)
    workers = _worker_processes(specs, policy, env, opts, log_dir)
    faults: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for w in workers:
            stack.callback(w.stop)
            w.start()
        try:
            wait_until(lambda: len(live_workers(app)) == len(workers), 90,
                       f"{len(workers)} {policy} workers")
        except TimeoutError:
            raise RuntimeError(f"workers did not start; logs in {log_dir}") from None
        dag_cls = Dag
        if policy == EXPIRES:  # Celery's own expires= at arrival + deadline
            dag_cls = expiring_dag(Dag, lambda t: getattr(workload.slo(t), "deadline_ms", None))
        dags = {name: dag_cls.from_spec(app, spec, task=kind.infer_task,
                                        step_task=kind.step_task,
                                        declare_exec_ms=kind.declare_exec_ms,
                                        batched={n: t for (d, n), t in batched_nodes.items()
                                                 if d == name})
                for name, spec in workload.dags.items()}
        stream = job_stream(workload, rate=opts.rate, jobs=opts.jobs)
        if opts.long_task_s is not None:  # first, so that it is warm-up for the latencies
            dags["long-task"] = _long_task_dag(app, workload, opts)
            stream = [(0.0, "long-task"), *stream]
        t0 = time.monotonic()
        clock = lambda: (time.monotonic() - t0) * 1000.0 / opts.time_scale  # noqa: E731
        waiter = _Waiter(redis_lib.Redis.from_url(redis_url), clock)
        waiter.start()
        stack.callback(waiter.stopping.set)
        schedule_faults(opts, workers, restart, stack, server=server, app=app,
                         log_dir=log_dir, policy=policy, events=faults, t0=t0)
        host = _host_load(workers, rig).start()
        sent = _send_stream(stream, dags, t0, clock, waiter, opts, policy, echo,
                            lambda: _cache_counters(client, prefix)[2], workload)
        _wait_for_jobs(sent, waiter, clock, opts, policy, echo)
        host.stop()
        time.sleep(opts.settle_s)  # the last acks land before anything counts as stranded
        stranded = stranded_messages(client, prefix, [w.name for w in workers])
        if is_amqp(broker):
            stranded.update(stranded_amqp(app.compass.queues, prefix, names))
        result = _measured(sent, workload, stream, opts, _cache_counters(client, prefix))
        handlers_ms = _handler_cpu_ms(client, prefix)  # read while the workers' counters stand
    # counted once the workers stopped: nothing can run again behind the count's back
    result.update(_delivery_counts(ledger, client, prefix, stranded))
    result["host"] = host.summary(result["executions"], handlers_ms)
    if batched:  # every batched pass the workers ran: sizes and time held open
        result["batching"] = read_batches(ledger, keys.key(BENCH_BATCHES, prefix))
    result["faults"] = faults
    result["admission"] = admission_on(opts, policy)
    result["admission_headroom"] = app.compass.settings.admission_headroom
    return result


def _host_load(workers: Sequence[WorkerProcess], rig: dict[str, list[int]] | None
               ) -> HostLoad:
    """The sampler of this run's host: the workers, this process (the producer: it plans
    and sends every job, and waits for them) and the rig's Redis servers."""
    return HostLoad({"workers": [w.proc.pid for w in workers if w.proc is not None],
                     "producer": [os.getpid()], **(rig or {})})


def _forget_previous_run(client: Any, ledger: Any, prefix: str) -> None:
    """Delete a previous run's state, jobs, queues and ledger under ``prefix``: its queues
    (``prefix.*``) and everything under its hash tag (``{prefix}:*``: worker records,
    learned times and plan error, jobs)."""
    for pattern in (f"{prefix}*", f"{{{prefix}}}*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
    ledger.delete(keys.key(keys.BENCH_EXECS, prefix), keys.key(keys.BENCH_STARTS, prefix),
                  keys.key(BENCH_BATCHES, prefix))
    forget_unacked(client, prefix)


def _bench_app(workload: Workload, policy: str, prefix: str, broker: str, redis_url: str,
               opts: BenchOptions, names: list[str],
               batched: dict[str, dict[str, Any]] | None = None) -> Any:
    """The submitting side's Celery app, configured as the workers are (``batched``: the
    workload's batched tasks, :func:`~compass_celery.emulated.batched_tasks`)."""
    amqp = is_amqp(broker)
    app = worker_kind(opts).app(broker, state_url=redis_url if amqp else None,
                   compass_policy=planner_policy(policy), compass_key_prefix=prefix,
                   compass_shared_queue=f"{prefix}.shared",
                   compass_queue_prefix=f"{prefix}.w.", compass_time_scale=opts.time_scale,
                   compass_heartbeat_timeout_s=opts.heartbeat_timeout_s,
                   compass_models=dict(workload.models), compass_job_timeout_s=3600,
                   compass_slo_classes=dict(workload.slo_classes),
                   compass_admission=admission_on(opts, policy),
                   compass_batching=opts.batching, compass_batch_aware=opts.batch_aware,
                   batched=batched or {},
                   **({} if opts.headroom is None
                      else {"compass_admission_headroom": opts.headroom}),
                   # the workers' held slot, which the producer's plans price too (the
                   # setting's default unless the run sets it, as the workers do)
                   **({} if "COMPASS_HOLD_MAX_MS" not in opts.extra_env
                      else {"compass_hold_max_ms": float(opts.extra_env["COMPASS_HOLD_MAX_MS"])}))
    if amqp:  # a previous run's messages in this vhost would run or count as stranded
        for name in [f"{prefix}.shared", *(f"{prefix}.w.{n}" for n in names)]:
            app.compass.queues.delete(name)
    return app


def admission_on(opts: BenchOptions, policy: str) -> bool:
    """Whether jobs are judged at submission: as asked, except for the Celery baselines,
    which stand for a Celery user who has no admission (their shared-queue plans predict
    nothing to judge anyway)."""
    return opts.admission and planner_policy(policy) != "celery-default"


def _worker_env(workload: Workload, policy: str, prefix: str, broker: str, redis_url: str,
                ledger_url: str | None, opts: BenchOptions) -> dict[str, str]:
    """The environment every worker process of this policy's cluster starts with."""
    return {"COMPASS_BROKER_URL": broker, "COMPASS_MODELS": json.dumps(workload.models),
            **({"COMPASS_REDIS_URL": redis_url} if is_amqp(broker) else {}),
            "COMPASS_POLICY": planner_policy(policy), "COMPASS_KEY_PREFIX": prefix,
            "COMPASS_SHARED_QUEUE": f"{prefix}.shared", "COMPASS_QUEUE_PREFIX": f"{prefix}.w.",
            "COMPASS_CACHE_POLICY": opts.cache_policy or (
                "lru" if planner_policy(policy) == "celery-default" else "lookahead"),
            "COMPASS_TIME_SCALE": str(opts.time_scale),
            "COMPASS_BATCHING": "1" if opts.batching else "0",
            "COMPASS_BATCH_AWARE": "1" if opts.batch_aware else "0",
            "COMPASS_HEARTBEAT_TIMEOUT_S": str(opts.heartbeat_timeout_s),
            "COMPASS_BENCH_LEDGER_URL": ledger_url or redis_url,
            # kombu sweeps expired unacked messages every 1 s, not every 100 s, so plain
            # Celery's redelivery after the visibility timeout shows within a run
            "COMPASS_RESTORE_INTERVAL_S": "1",
            "COMPASS_VISIBILITY_TIMEOUT": str(effective_visibility_s(opts)),
            # the repeated-kill fault runs the workers with the atomic fetch it needs
            **({"COMPASS_ATOMIC_FETCH": "1"} if opts.kill_restarts else {}),
            **worker_kind(opts).worker_env(), **opts.extra_env}


def _worker_processes(specs: Sequence[WorkerSpec], policy: str, env: dict[str, str],
                      opts: BenchOptions, log_dir: str) -> list[WorkerProcess]:
    """One worker process per spec (not started)."""
    kind = worker_kind(opts)
    workers = []
    for i, s in enumerate(specs):
        wenv = dict(env)
        if opts.skew_clock_s and i == 0:  # one worker's wall clock runs ahead
            wenv["PYTHONPATH"] = os.pathsep.join(
                [CLOCKSKEW_DIR, os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])
            wenv["COMPASS_CLOCK_SKEW_S"] = str(opts.skew_clock_s)
        workers.append(WorkerProcess(kind.module, f"{s.name}@{policy}",
                                     kind.worker_args(s, opts.time_scale, opts.device),
                                     env=wenv,
                                     log_path=os.path.join(log_dir, f"{policy}-{s.name}.log")))
    return workers


class _Sent:
    """What the stream sent: every job's outcome, the handles of those submitted, and the
    model loads counted when warm-up ended."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.outcomes: list[JobOutcome] = []
        self.handles: list[tuple[JobOutcome, Any]] = []
        self.loads_at_warmup = 0
        self.wall0_s = 0.0  # the wall time (epoch s) at which the bench's clock began


def _send_stream(stream: list[tuple[float, str]], dags: dict[str, Any], t0: float,
                 clock: Callable[[], float], waiter: _Waiter, opts: BenchOptions,
                 policy: str, echo: Callable[[str], Any],
                 loads_now: Callable[[], int], workload: Workload | None = None) -> _Sent:
    """Submit each job at its arrival time (open loop), with its template's SLO class; a
    failed submission is a failed job, never a lost one, and one admission refused is
    rejected, ended when the refusal came back."""
    sent = _Sent(int(len(stream) * opts.warmup_frac))
    sent.wall0_s = time.time() - (time.monotonic() - t0)
    slos = {name: workload.slo(name) for name in dags} if workload is not None else {}
    for i, (at_ms, name) in enumerate(stream):
        delay = t0 + at_ms * opts.time_scale / 1000.0 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if i == sent.skip:  # warm-up ends as the first job after it arrives (as simulated)
            sent.loads_at_warmup = loads_now()
        outcome = JobOutcome(i, name, clock())
        sent.outcomes.append(outcome)
        try:
            # warm-up jobs carry their deadlines too, as a service's first traffic does:
            # the first loads are taken late (a cold start) and admission starts learning
            # how late its plans run; only the jobs after warm-up are scored
            handle = submit(dags[name], outcome, slos.get(name), clock)
        except Exception as exc:  # a failed submission is a failed job, never a lost one
            echo(f"  job {i} ({name}) failed at submission: {exc}")
            outcome.end_ms, outcome.failed = clock(), True
            continue
        if handle is None:  # refused by admission: nothing was written or sent
            _progress(opts, policy, i + 1, len(stream), sent.outcomes)
            continue
        waiter.watch(handle.keys.done, outcome)
        sent.handles.append((outcome, handle))
        _progress(opts, policy, i + 1, len(stream), sent.outcomes)
    return sent


def _wait_for_jobs(sent: _Sent, waiter: _Waiter, clock: Callable[[], float],
                   opts: BenchOptions, policy: str, echo: Callable[[str], Any]) -> None:
    """Wait for every job to end (up to the drain timeout); jobs whose records a Redis
    restart lost are failed as soon as that is seen."""
    total = len(sent.outcomes)
    deadline = time.monotonic() + opts.drain_timeout_s
    next_settle = time.monotonic() + 5.0
    gone = 0
    while any(o.end_ms is None for o in sent.outcomes) and time.monotonic() < deadline:
        _progress(opts, policy, total, total, sent.outcomes)
        if opts.restart_redis_after is not None and time.monotonic() > next_settle:
            # records gone with a restart: those jobs failed, no need to wait for them
            gone += _settle_unfinished(sent.handles, clock, echo, quiet=True)
            next_settle = time.monotonic() + 5.0
        time.sleep(0.1)
    waiter.stopping.set()
    if opts.progress and sys.stderr.isatty():
        sys.stderr.write("\n")
    gone += _settle_unfinished(sent.handles, clock, echo, quiet=True)
    read_records(sent.handles)  # shed (DeadlineMissed) is not failed; late from the record
    if gone:
        echo(f"  {gone} job(s) failed: their records were lost from Redis (no persistence)")


def _measured(sent: _Sent, workload: Workload, stream: list[tuple[float, str]],
              opts: BenchOptions, counters: tuple[int, int, int]) -> dict[str, Any]:
    """Latencies, cache counters, loads after warm-up and the per-task breakdown."""
    hits, misses, loads = counters
    result = policy_result(sent.outcomes, opts.warmup_frac, hits, misses, loads)
    admitted = [o for o in sent.outcomes[sent.skip:] if not o.rejected]
    late_tasks = sum(len(workload.dags[o.dag].nodes) if o.dag in workload.dags else 1
                     for o in admitted)  # a refused job's tasks never ran
    result["loads_after_warmup"] = loads - sent.loads_at_warmup
    result["load_fraction"] = round((loads - sent.loads_at_warmup) / max(1, late_tasks), 4)
    result["loads_per_job"] = round((loads - sent.loads_at_warmup) / max(1, len(admitted)), 4)
    result["breakdown_ms"] = _breakdown(sent.handles, opts.warmup_frac, len(stream))
    result.update(_predicted_vs_measured(sent, opts))
    result["latencies_ms"] = [round(o.end_ms - o.arrival_ms, 3)  # type: ignore[operator]
                              for o in sent.outcomes if o.completed
                              and o.index >= int(len(sent.outcomes) * opts.warmup_frac)]
    result["per_job"] = job_records(sent.outcomes)  # warm-up included, marked by index
    work = {name: sum(t.exec_ms for t in dag.nodes.values())
            for name, dag in workload.dags.items()}
    share = left_capacity_share(sent.outcomes, work, len(workload.cluster.workers))
    if share is not None:
        result["batch_share"] = share
    runs = task_runs(sent.handles, sent.wall0_s, opts.time_scale)
    window = window_batch_share(sent.outcomes, runs, len(workload.cluster.workers))
    if window is not None:
        result["batch_share_window"] = window
    return result


def _delivery_counts(ledger: Any, client: Any, prefix: str,
                     stranded: dict[str, int]) -> dict[str, Any]:
    """What the delivery contract promises: duplicates from the ledger, stranded and
    dead-lettered messages."""
    finished = ledger_counts(ledger, keys.key(keys.BENCH_EXECS, prefix))
    started = ledger_counts(ledger, keys.key(keys.BENCH_STARTS, prefix))
    return {"duplicates": duplicate_count(finished),
            "duplicate_starts": duplicate_count(started),
            "executions": sum(finished.values()),
            "duplicated_task_ids": duplicated_ids(started),
            "stranded": sum(stranded.values()),
            "stranded_where": {k: v for k, v in stranded.items() if v},
            "dead_lettered": int(client.llen(keys.key(keys.DEAD_LETTER, prefix)))}


def _long_task_dag(app: Any, workload: Workload, opts: BenchOptions) -> Any:
    """One node on the workload's smallest model that runs ``long_task_s`` real seconds."""
    from ..emulated import INFER_TASK
    from ..jobs.dag import Dag

    assert opts.long_task_s is not None
    model = min(workload.models, key=lambda m: workload.models[m])
    exec_ms = opts.long_task_s * 1000.0 / opts.time_scale  # workload ms
    dag = Dag(app, "long-task")
    dag.node("long", app.signature(INFER_TASK, args=(model, exec_ms, None)),
             model=model, exec_ms=exec_ms)
    return dag


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


def _handler_cpu_ms(client: Any, prefix: str) -> float | None:
    """The mean CPU ms compass's handlers spent on a task, over every worker's published
    counters (``None`` before any published one)."""
    cpu_ms = tasks = 0.0
    for raw in client.hgetall(keys.key(keys.WORKER_STATS, prefix)).values():
        try:
            rec = json.loads(raw)
            cpu_ms, tasks = (cpu_ms + float(rec.get("compass_cpu_ms", 0.0)),
                             tasks + int(rec.get("tasks", 0)))
        except (ValueError, TypeError, AttributeError):
            continue
    return round(cpu_ms / tasks, 3) if tasks else None


def _cache_counters(client: Any, prefix: str) -> tuple[int, int, int]:
    hits = misses = loads = 0
    for raw in client.hgetall(keys.key(keys.WORKER_STATS, prefix)).values():
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
        if outcome.index < skip or not outcome.completed:
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


def _predicted_vs_measured(sent: _Sent, opts: BenchOptions) -> dict[str, Any]:
    """Each term the plan predicted against what the workers measured, after warm-up:
    per node (queue wait, load, run, finish) and per job: its finish as the sender saw
    it (``jobs``: from the call to the result, so with the submission and the result's
    delivery, which no plan covers) and as the plan did (``jobs_plan``: from the plan to
    its last node's end)."""
    rows: list[dict[str, Any]] = []
    jobs: list[tuple[float, float]] = []
    planned: list[tuple[float, float]] = []
    infos: list[dict[str, Any]] = []
    for outcome, handle in sent.handles:
        if outcome.index < sent.skip or not outcome.completed:
            continue
        try:
            job = {k.decode(): v for k, v in handle.client.hgetall(handle.keys.job).items()}
            plan = json.loads(job.get("plan") or "{}")
            nodes = {k[2:]: json.loads(v) for k, v in job.items() if k.startswith("n:")}
            info = {k.decode(): json.loads(v)
                    for k, v in handle.client.hgetall(handle.keys.info).items()}
        except Exception:
            continue
        infos.append(info)
        created = float(job.get("created") or 0.0)
        rows += [{**row, "job": outcome.index}  # to group a job's rows (terms.py)
                 for row in node_rows(plan, info, created, nodes, opts.time_scale)]
        if plan:
            finish = max(float(p["finish_ms"]) for p in plan.values())
            jobs.append((finish, outcome.end_ms - outcome.arrival_ms))
            ends = [float(m["finished"]) for m in info.values() if "finished" in m]
            if created and ends:
                planned.append((finish, (max(ends) - created) * 1000.0 / opts.time_scale))
    return {"prediction": {"nodes": term_errors(rows), "jobs": job_rows(jobs),
                           "jobs_plan": job_rows(planned), "loads": load_outcomes(rows)},
            "prediction_rows": rows, "hop_ms": hop_ms(infos, opts.time_scale),
            "hop_mean_ms": hop_ms(infos, opts.time_scale, statistics.fmean),
            "hop_gaps_ms": [round(g, 3) for g in hop_gaps(infos, opts.time_scale)]}


def _private_redis(stack: contextlib.ExitStack, args: Sequence[str] = ()) -> RedisServer:
    return stack.enter_context(RedisServer(args=args))


def _check_broker(url: str) -> None:
    """Fail early, naming the broker, when it does not answer."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        raise ConnectionError(f"cannot reach the broker at {masked(url)}: "
                              f"{exc}") from None


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
                raise ConnectionError(f"cannot reach Redis at {masked(url)}: {exc}") from None
        if opts.broker_url is not None:
            _check_broker(opts.broker_url)
        rig = {"redis": [server.proc.pid]} if server is not None and server.proc else {}
        try:  # the execution ledger lives apart, where no Redis fault reaches it
            ledger = _private_redis(stack)
            ledger_url = ledger.url
            rig["ledger"] = [ledger.proc.pid] if ledger.proc else []
        except LocalRedisError:
            ledger_url = url
        results = {}
        for policy in opts.policies:
            n = len(workload.cluster.workers) if opts.workers is None else opts.workers
            what = "real-model cpu" if opts.real else "emulated-GPU"
            echo(f"policy {policy}: starting {n} {what} workers")
            results[policy] = run_policy(workload, policy, url, opts, echo, server=server,
                                         ledger_url=ledger_url, rig=rig)
            r = results[policy]
            lat = r["latency_ms"]
            echo(f"  mean {lat['mean']:.1f} ms, p99 {lat['p99']:.1f} ms, "
                 f"completed {r['completed']}/{r['jobs']}, duplicates {r['duplicates']}, "
                 f"stranded {r['stranded']}")
            if r.get("host"):
                echo(host_line(r["host"]))
    return {"workload": workload.name, "time_scale": opts.time_scale,
            "emulated_gpu": worker_kind(opts).emulated_gpu,
            "broker": "amqp" if is_amqp(opts.broker_url) else "redis",
            "rate_per_s": opts.rate or workload.arrivals.rate_per_s,
            "seed": workload.arrivals.seed,
            "heartbeat_timeout_s": opts.heartbeat_timeout_s,
            "visibility_timeout_s": effective_visibility_s(opts),
            "wall_s": round(time.time() - started, 1), "policies": results}


__all__ = ["POLICIES", "BenchOptions", "latency_summary", "run_bench", "run_policy",
           "stranded_messages"]
