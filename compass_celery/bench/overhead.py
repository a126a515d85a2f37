"""What Compass costs on the hot path, measured against plain Celery on a real Redis.

``compass-celery bench overhead`` prints:
- one placement decision (the router call) with 4 and 64 workers' records,
  snapshot served from the local cache and read fresh from Redis (µs), and at 64 a
  level-9 task's, which overtakes the lowest level's work waiting on the workers
  (after the enqueue lines, which it would otherwise share the machine with);
- enqueue latency of a compass-routed task against a plain one (µs), and the producer's
  CPU an enqueue (its own thread each way; compass's threads per routed one), which a
  loaded machine moves far less than the latency;
- a 3-task no-op chain on idle workers: ``Dag`` against Celery's ``chain`` (ms),
  the per-hop overhead that the benchmark's lower bound adds, and the CPU each costs
  the workers (a task) and the producer (a job).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..local import RedisServer, WorkerProcess, wait_until
from ..planner.types import WorkerView
from .hostload import process_cpu_s


def _stats(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    return f"median {statistics.median(samples):8.1f}  p99 {p99:8.1f}"


def _time(fn: Callable[[], Any], n: int, unit: float) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * unit)
    return out


def _fake_workers(app: Any, n: int) -> None:
    """``n`` worker records, beating now (the measuring app's heartbeat timeout is long)."""
    models = list(app.compass.model_sizes())
    for i in range(n):
        name = f"fake{i:03d}"
        app.compass.store.publish(WorkerView(
            name=name, queue=app.compass.queue_for(name), gpu_total_mb=16000,
            gpu_free_mb=8000, resident=frozenset(models[j % len(models)]
                                                 for j in range(i, i + 2)),
            heartbeat=time.time()))


def placement_cost(url: str, echo: Callable[[str], Any]) -> None:
    """Print one routing decision's cost at 4 and 64 fake workers, cached and fresh snapshot."""
    from ..emulated import make_app

    for n in (4, 64):
        for ttl, label in ((60.0, "cached snapshot"), (0.0, "fresh snapshot")):
            app = make_app(url, compass_key_prefix=f"ovh{n}", compass_snapshot_ttl_s=ttl,
                           compass_snapshot_refresh_ahead_s=0.0,  # fresh: read, not ahead
                           compass_heartbeat_timeout_s=3600.0)
            _fake_workers(app, n)
            router, opts = app.compass.router, {}
            task = app.tasks["emulated.caption"]
            router("emulated.caption", (), {}, dict(opts), task)  # warm up
            samples = _time(lambda r=router, t=task: r("emulated.caption", (), {}, {}, t),
                            2000 if ttl else 500, 1e6)
            echo(f"placement decision, {n:3d} workers, {label:16s} µs: {_stats(samples)}")


def level_cost(url: str, echo: Callable[[str], Any], n: int = 64) -> None:
    """Print one routing decision's cost for a level-9 task among ``n`` fake workers
    with the lowest level's work waiting on them (as a mix of levels has it): what
    the task overtakes is taken off each worker it would wait behind."""
    from ..emulated import make_app

    app = make_app(url, compass_key_prefix=f"lvl{n}", compass_snapshot_ttl_s=60.0,
                   compass_snapshot_refresh_ahead_s=0.0, compass_heartbeat_timeout_s=3600.0)
    _fake_workers(app, n)
    router, task = app.compass.router, app.tasks["emulated.caption"]
    for _ in range(200):  # level-0 work waiting on the workers
        router("emulated.caption", (), {}, {}, task)
    samples = _time(lambda: router("emulated.caption", (), {}, {"priority": 9}, task), 2000,
                    1e6)
    echo(f"placement decision, {n:3d} workers, level 9, cached µs: {_stats(samples)}")


def enqueue_cost(url: str, echo: Callable[[str], Any], n: int = 64, rounds: int = 1000
                 ) -> None:
    """Enqueue latency, plain Celery routing against compass routing among ``n`` workers'
    records (default snapshot cache), alternated call by call so that drift in the
    machine's speed hits both alike."""
    from ..emulated import make_app

    app = make_app(url, compass_key_prefix="enq", compass_heartbeat_timeout_s=3600.0)
    _fake_workers(app, n)
    plain, infer = app.tasks["emulated.plain"], app.tasks["emulated.infer"]
    opts = {"compass": {"model": "detector", "exec_ms": 5}}
    for _ in range(50):  # warm up both paths (connections, scripts, snapshot)
        plain.apply_async((1,))
        infer.apply_async(("detector", 5, None), **opts)
    plain_us, compass_us = [], []
    cpu = CpuSplit()
    for _ in range(rounds):
        plain_us += cpu.timed("plain", lambda: plain.apply_async((1,)))
        compass_us += cpu.timed("compass", lambda: infer.apply_async(("detector", 5, None),
                                                                     **opts))
    charges = app.compass.router.charges
    if charges is not None:
        charges.flush()
    cpu.stop()
    echo(f"enqueue among {n} workers, plain Celery route µs: {_stats(plain_us)}")
    echo(f"enqueue among {n} workers, compass route      µs: {_stats(compass_us)}")
    echo(f"added enqueue latency at {n} workers (median)  µs: "
         f"{statistics.median(compass_us) - statistics.median(plain_us):8.1f}")
    cpu.report(n, echo)


class CpuSplit:
    """The producer's CPU per enqueue, which other load on the machine barely moves (its
    wall time it does): this thread's, per kind, and what compass's own threads (backlog
    charge flushes, snapshot reads ahead) spent meanwhile, per routed enqueue."""

    def __init__(self) -> None:
        self.thread_s = {"plain": 0.0, "compass": 0.0}
        self.calls = {"plain": 0, "compass": 0}
        self.process0, self.thread0 = time.process_time(), time.thread_time()
        self.others_s = 0.0

    def timed(self, kind: str, fn: Callable[[], Any]) -> list[float]:
        """Run ``fn`` once as ``kind``: its wall time (µs), its CPU in this thread kept."""
        cpu = time.thread_time()
        wall = _time(fn, 1, 1e6)
        self.thread_s[kind] += time.thread_time() - cpu
        self.calls[kind] += 1
        return wall

    def stop(self) -> None:
        """The other threads' CPU since the start (call once every charge is flushed)."""
        self.others_s = (time.process_time() - self.process0) \
            - (time.thread_time() - self.thread0)

    def report(self, n: int, echo: Callable[[str], Any]) -> None:
        """One line: this thread's CPU per enqueue each way, and compass's threads'."""
        plain, routed = (1e6 * self.thread_s[k] / max(self.calls[k], 1)
                         for k in ("plain", "compass"))
        others = 1e6 * self.others_s / max(self.calls["compass"], 1)
        echo(f"producer CPU an enqueue at {n} workers µs: plain {plain:.1f}, compass "
             f"{routed:.1f} (+{routed - plain:.1f}), compass's threads {others:.1f}")


class Alternated:
    """The 3-task chains, Celery's and compass's, run in turn: each one's latency, and
    the CPU it cost the workers and this process (the producer, waiting on the result)."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.pids = worker_pids
        self.ms: dict[str, list[float]] = {"chain": [], "dag": []}
        self.cpu_s: dict[str, list[float]] = {"chain": [0.0, 0.0], "dag": [0.0, 0.0]}

    def _workers_cpu_s(self) -> float:
        return sum(process_cpu_s(p) or 0.0 for p in self.pids)

    def time(self, kind: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once as a ``kind`` ("chain" or "dag") job: its latency and CPU."""
        workers, producer = self._workers_cpu_s(), time.process_time()
        self.ms[kind] += _time(fn, 1, 1e3)
        self.cpu_s[kind][0] += self._workers_cpu_s() - workers
        self.cpu_s[kind][1] += time.process_time() - producer

    def report(self, echo: Callable[[str], Any]) -> None:
        """Each kind's latency, their ratio, and the CPU a task and a job, one line each."""
        chain_ms, dag_ms = self.ms["chain"], self.ms["dag"]
        echo(f"3-task no-op chain, Celery chain   ms: {_stats(chain_ms)}")
        echo(f"3-task no-op chain, compass Dag    ms: {_stats(dag_ms)}")
        echo(f"Dag / chain (medians)                : "
             f"{statistics.median(dag_ms) / statistics.median(chain_ms):8.2f}x")
        echo(f"compass hop overhead (Dag / 3)     ms: {statistics.median(dag_ms) / 3:8.2f}")
        # (side, its index in cpu_s, what its CPU is per, how many of those a job is)
        for side, i, per, each in (("workers", 0, "task", 3), ("producer", 1, "job", 1)):
            chain_cpu, dag_cpu = (1000 * self.cpu_s[k][i] / max(len(self.ms[k]) * each, 1)
                                  for k in ("chain", "dag"))
            echo(f"CPU a {per:4s}, {side:8s} chain / Dag ms: {chain_cpu:8.2f} / {dag_cpu:.2f}")


def run(echo: Callable[[str], Any] = print) -> None:
    """Print every cost the module lists, on a private Redis with two emulated workers."""
    from celery import chain

    from ..emulated import make_app
    from ..jobs.dag import Dag

    with RedisServer() as server:
        url = server.url
        placement_cost(url, echo)
        enqueue_cost(url, echo)
        level_cost(url, echo)
        env = {"COMPASS_BROKER_URL": url, "COMPASS_KEY_PREFIX": "ovh"}
        workers = [WorkerProcess("compass_celery.emulated_app", f"ovh{i}@bench",
                                 ["--compass-emulate-gpu-mb", "1600", "--compass-preload",
                                  "detector,translator,classifier"], env=env).start()
                   for i in range(2)]
        try:
            app = make_app(url, compass_key_prefix="ovh")
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3).workers) == 2,
                       60, "two workers")
            plain, infer, step = (app.tasks[f"emulated.{t}"] for t in ("plain", "infer", "step"))
            opts = {"compass": {"model": "detector", "exec_ms": 0}}
            plain_us = _time(lambda: plain.apply_async((1,)), 300, 1e6)
            compass_us = _time(lambda: infer.apply_async(("detector", 0, None), **opts), 300,
                               1e6)
            echo(f"enqueue, plain Celery route        µs: {_stats(plain_us)}")
            echo(f"enqueue, compass route             µs: {_stats(compass_us)}")
            echo(f"added enqueue latency (median)     µs: "
                 f"{statistics.median(compass_us) - statistics.median(plain_us):8.1f}")
            time.sleep(1.0)
            dag = Dag(app, "noop3")
            a = dag.node("a", infer.s("detector", 0, None), model="detector", exec_ms=0)
            b = dag.node("b", step.s("translator", 0), after=[a], model="translator", exec_ms=0)
            dag.node("c", step.s("classifier", 0), after=[b], model="classifier", exec_ms=0)
            chains = Alternated([w.proc.pid for w in workers if w.proc is not None])
            for _ in range(200):  # alternated, so drift in the machine's speed hits both
                chains.time("chain", lambda: chain(plain.s(1), plain.s(), plain.s())
                            .apply_async().get(timeout=10))
                chains.time("dag", lambda: dag.apply_async().get(timeout=10))
            chains.report(echo)
        finally:
            for w in workers:
                w.stop()
