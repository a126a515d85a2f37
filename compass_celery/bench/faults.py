"""Faults the benchmark injects while jobs arrive: a killed worker, a restarted or
paused Redis, a rolling restart (each worker SIGTERMed in turn, as a deploy does)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ..broker.amqp import is_amqp
from ..local import RedisServer, WorkerProcess, wait_until
from .options import BenchOptions

#: The repeated-kill fault (``--kill-restart N``): from this many real seconds into a run,
#: a kill this many seconds apart on average.
KILL_RESTART_FROM_S, KILL_RESTART_EVERY_S = 3.0, 1.5


def live_workers(app: Any) -> set[str]:
    """Names of the workers whose records the submitting process sees as live."""
    return {w.name for w in app.compass.store.snapshot(time.time(), 5.0).workers}


def schedule_faults(opts: BenchOptions, workers: list[WorkerProcess],
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

    if is_amqp(opts.broker_url) and (opts.restart_redis_after is not None
                                     or opts.pause_redis_after is not None):
        raise ValueError("restarting or pausing the broker Redis does not apply over AMQP: "
                         "the broker is RabbitMQ")
    if opts.kill_worker_after is not None:
        jobs.append((opts.kill_worker_after, kill))
    if opts.kill_restarts:
        jobs.append((KILL_RESTART_FROM_S, lambda: kill_restart_loop(
            workers, int(opts.kill_restarts or 0), KILL_RESTART_EVERY_S, stopping, events, at,
            random.Random(len(workers)))))
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
        wait_until(lambda: stopping.is_set() or w.name in live_workers(app), 90,
                   f"{w.name} back after restart", interval=0.1)
        event["live_at_s"] = at()
    except TimeoutError as exc:
        event["note"] = str(exc)
    return event


def kill_restart_loop(workers: list[WorkerProcess], kills: int, every_s: float,
                      stopping: threading.Event, events: list[dict[str, Any]],
                      at: Callable[[], float], rng: random.Random) -> None:
    """SIGKILL a random worker ``kills`` times, at random moments ``every_s`` apart on
    average, and start it again at once under its own name: the hunt for the fetch
    window. Gaps are drawn from 0.1 s to twice ``every_s``, so some kills land while a
    worker consumes and some while it starts or takes back what its last life left."""
    for n in range(kills):
        if stopping.wait(rng.uniform(0.1, max(0.2, 2 * every_s - 0.1))):
            return
        w = rng.choice(workers)
        starting = w.proc is not None and time.monotonic() - getattr(w, "started_at", 0.0) < 3
        w.kill(signal.SIGKILL)
        if w.proc is not None:
            w.proc.wait()
        events.append({"fault": "kill-restart", "worker": w.name, "n": n, "at_s": at(),
                       "within_3s_of_start": starting})
        w.start()
        w.started_at = time.monotonic()  # type: ignore[attr-defined]
