"""Interactive work under a batch flood: does a click wait only for what is in flight?

Every worker is kept busy by a stream of long batch tasks (more queued than the
workers can run), while short interactive tasks and two-node interactive jobs
arrive at random. What a user expects of ``priority=``:

* an interactive task's (or two-node job's) latency is at most its own run time,
  plus the longest batch task that may be in flight when it arrives, plus a small
  overhead (the bound the report checks at p99, with 50 ms of overhead): its
  successor must not wait for a second batch task;
* batch work is not starved: it still uses at least 80% of the capacity that
  interactive work leaves.

Real workers (emulated GPUs that sleep), a private Redis, Redis or RabbitMQ as
the broker: ``compass-celery bench flood [--broker amqp://...]``.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from ..local import RedisServer, WorkerProcess, wait_until

MODEL = "captioner"
GPU = ["--compass-emulate-gpu-mb", "1600", "--compass-preload", MODEL]
#: Allowed overhead on top of run time + the longest batch task in flight.
OVERHEAD_MS = 50.0


def _app(broker: str, state: str) -> Any:
    from ..emulated import make_app

    return make_app(broker, state_url=state, compass_snapshot_ttl_s=0.0)


def _send(app: Any, run_ms: float, i: int, priority: str) -> Any:
    return app.tasks["emulated.infer"].apply_async(
        (MODEL, run_ms, i), compass={"model": MODEL, "exec_ms": run_ms}, priority=priority)


def _job(app: Any, run_ms: float, i: int) -> Any:
    from ..jobs.dag import Dag

    dag = Dag(app, f"click-{i}")
    a = dag.node("a", app.tasks["emulated.infer"].s(MODEL, run_ms, i), model=MODEL,
                 exec_ms=run_ms)
    dag.node("b", app.tasks["emulated.step"].s(MODEL, run_ms), after=[a], model=MODEL,
             exec_ms=run_ms)
    return dag.apply_async(priority="interactive")


class _Batch(threading.Thread):
    """Keeps ``backlog`` batch tasks queued beyond what the workers run, until stopped."""

    def __init__(self, app: Any, run_ms: float, backlog: int) -> None:
        super().__init__(daemon=True)
        self.app, self.run_ms, self.backlog = app, run_ms, backlog
        self.sent: list[tuple[float, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            waiting = sum(1 for _, r in self.sent[-4 * self.backlog:] if not r.ready())
            for _ in range(max(0, self.backlog - waiting)):
                self.sent.append((time.monotonic(), _send(self.app, self.run_ms, i, "batch")))
                i += 1
            self.stop.wait(0.1)


def run(broker: str | None, workers: int = 2, seconds: float = 30.0,
        batch_ms: float = 500.0, click_ms: float = 50.0, clicks_per_s: float = 2.0,
        seed: int = 0) -> dict[str, Any]:
    """One flood run; latencies in ms, the bound and the batch share in the result."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer())
        broker = server.url if broker in (None, "redis") else broker
        env = {"COMPASS_BROKER_URL": broker, "COMPASS_REDIS_URL": server.url,
               "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0"}
        logs = tempfile.mkdtemp(prefix="compass-flood-")
        procs = [WorkerProcess("compass_celery.emulated_app", f"f{i}@flood", GPU, env=env,
                               log_path=os.path.join(logs, f"f{i}.log")).start()
                 for i in range(workers)]
        for p in procs:
            stack.callback(p.stop)
        app = _app(broker, server.url)
        stack.callback(app.compass.close)
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers)
                   == workers, 60, f"{workers} workers")
        flood = _Batch(app, batch_ms, backlog=4 * workers)
        flood.start()
        time.sleep(2 * batch_ms / 1000)  # every worker busy, a queue behind each
        rng = random.Random(seed)
        clicks: list[tuple[float, Any, str]] = []
        t0 = time.monotonic()
        end = t0 + seconds
        i = 0
        while time.monotonic() < end:
            time.sleep(rng.expovariate(clicks_per_s))
            kind = "job" if i % 4 == 3 else "task"
            sent = time.monotonic()
            handle = _job(app, click_ms, i) if kind == "job" else \
                _send(app, click_ms, i, "interactive")
            clicks.append((sent, handle, kind))
            i += 1
        window = (time.time() - (time.monotonic() - t0), time.time())  # epoch s
        flood.stop.set()
        flood.join()
        latencies: dict[str, list[float]] = {"task": [], "job": []}
        for sent, handle, kind in clicks:
            handle.get(timeout=120)
            latencies[kind].append(_ended(handle, kind) - sent)
        # batch work done while clicks arrived: what the flood got of the capacity
        done = sum(1 for _, r in flood.sent if r.ready()
                   and window[0] <= _ended_epoch(r) <= window[1])
        report = _report(latencies, done, window[1] - window[0], workers, batch_ms,
                         click_ms, clicks, "amqp" if broker.startswith("amqp") else "redis")
        flood.sent.clear()  # results let go while their backend is still up
        clicks.clear()
    return report


def _ended_epoch(result: Any) -> float:
    """When a plain task finished (epoch s), from its result's ``date_done`` (UTC)."""
    done = result.date_done
    if done is None:
        return time.time()
    if isinstance(done, str):
        done = datetime.fromisoformat(done)
    if done.tzinfo is None:
        done = done.replace(tzinfo=UTC)
    return done.timestamp()


def _ended(handle: Any, kind: str) -> float:
    """When a click's answer was ready (monotonic s), from the worker's recorded end."""
    if kind == "job":
        finished = max(v.get("finished", 0.0) for v in handle.placement().values())
    else:
        finished = _ended_epoch(handle)
    return time.monotonic() - (time.time() - finished)


def _report(latencies: dict[str, list[float]], batch_done: int, span_s: float,
            workers: int, batch_ms: float, click_ms: float, clicks: Sequence[Any],
            broker: str) -> dict[str, Any]:
    def pct(xs: list[float], q: float) -> float:
        return round(float(np.percentile(np.asarray(xs) * 1000, q)), 1) if xs else 0.0

    # its own run time (a job: both nodes), the longest batch task in flight, overhead
    task_bound = click_ms + batch_ms + OVERHEAD_MS
    job_bound = 2 * click_ms + batch_ms + OVERHEAD_MS
    click_work_s = (len(latencies["task"]) + 2 * len(latencies["job"])) * click_ms / 1000
    left_s = workers * span_s - click_work_s  # worker-seconds interactive work leaves
    share = batch_done * batch_ms / 1000 / left_s if left_s > 0 else 0.0
    return {
        "broker": broker, "workers": workers, "seconds": round(span_s, 1),
        "batch_ms": batch_ms, "click_ms": click_ms, "clicks": len(clicks),
        "task": {"n": len(latencies["task"]), "p50_ms": pct(latencies["task"], 50),
                 "p99_ms": pct(latencies["task"], 99), "bound_ms": task_bound,
                 "met": pct(latencies["task"], 99) <= task_bound},
        "job": {"n": len(latencies["job"]), "p50_ms": pct(latencies["job"], 50),
                "p99_ms": pct(latencies["job"], 99), "bound_ms": job_bound,
                "met": pct(latencies["job"], 99) <= job_bound},
        "batch": {"done": batch_done, "share_of_left_capacity": round(share, 3),
                  "met": share >= 0.8},
    }


def table(results: Sequence[dict[str, Any]]) -> str:
    """The flood results as a Markdown table."""
    rows = ["| broker | interactive tasks p50 / p99 (bound) | interactive jobs p50 / p99 "
            "(bound) | batch share of the capacity left |", "|---|---|---|---|"]
    for r in results:
        t, j, b = r["task"], r["job"], r["batch"]
        rows.append(f"| {r['broker']} | {t['p50_ms']:.0f} / {t['p99_ms']:.0f} ms "
                    f"({t['bound_ms']:.0f}) | {j['p50_ms']:.0f} / {j['p99_ms']:.0f} ms "
                    f"({j['bound_ms']:.0f}) | {100 * b['share_of_left_capacity']:.0f}% |")
    return "\n".join(rows)
