"""Replay a workload's task stream through CacheDecider: hit rate and loads per policy.

A quick, deterministic check of the eviction policies alone (no planner, no timing):
the jobs are the workload's own seeded job stream (the one the simulator and the
benchmark replay, read through :mod:`compass_celery.workload`), each job's tasks in
topological order; they go to one worker per job (job round-robin, as a collocating
planner would) or each task to the worker its model hashes to, and each worker sees
a window of its own upcoming tasks as its queue. ``--models MODULE:FUNCTION`` also
measures real CPU load time per MB of the torch models that function registers
(``workers.models:register_example_models`` for the repository's examples).

    compass-celery cache hitrate --workload dags/edge-vision.json
"""

from __future__ import annotations

import importlib
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from compass_celery import workloads
from compass_celery.cache.decisions import CacheDecider, Load
from compass_celery.cache.registry import ModelRegistry
from compass_celery.workload import Workload, job_stream

DEFAULT_WORKLOAD = str(workloads.path("edge-vision.json"))


def task_streams(workload: Workload, workers: int, assign: str) -> list[list[str]]:
    """Per worker, the models of its tasks in arrival order (``assign``: "rr" or "hash")."""
    streams: list[list[str]] = [[] for _ in range(workers)]
    for job, (_, name) in enumerate(job_stream(workload)):
        dag = workload.dags[name]
        for node in dag.topological_order():
            model = dag.nodes[node].model
            if model is None:
                continue
            w = job % workers if assign == "rr" else zlib.crc32(model.encode()) % workers
            streams[w].append(model)
    return streams


def replay(
    streams: Sequence[Sequence[str]],
    sizes: dict[str, float],
    capacity_mb: float,
    policy: str,
    window: int,
    prefetch: bool = False,
) -> dict[str, float]:
    """Hits, misses and loads of ``policy`` over the per-worker streams."""
    hits = misses = loads = 0
    for stream in streams:
        d = CacheDecider(capacity_mb, policy, sizes)
        for i, model in enumerate(stream):
            queued = stream[i + 1 : i + 1 + window]
            acts = d.on_need(model, queued=queued, now=float(i))
            new = [a for a in acts if isinstance(a, Load)]
            hits, misses, loads = hits + (not new), misses + bool(new), loads + len(new)
            for a in new:
                d.on_loaded(a.name, now=float(i))
            if prefetch:
                for a in d.prefetch(queued, running=model, lookahead=3, now=float(i)):
                    if isinstance(a, Load):
                        loads += 1
                        d.on_loaded(a.name, now=float(i))
    n = hits + misses
    return {"hit_rate": hits / n if n else 0.0, "loads": loads, "tasks": n}


def cpu_load_ms_per_mb(registry: ModelRegistry, reps: int = 3) -> dict[str, tuple[float, float]]:
    """Per registered model: (MB, median real load time per MB) building it onto the CPU."""
    from compass_celery.cache.backends import TorchBackend

    backend = TorchBackend("cpu")
    out = {}
    for name in registry.names():
        spec = registry.get(name)
        times, mb = [], 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            _, mb = backend.load(name, spec.loader, spec.size_mb)
            times.append((time.perf_counter() - t0) * 1000)
            backend.evict(name)
        out[name] = (mb, statistics.median(times) / mb)
    return out


def registrar(spec: str) -> Callable[[ModelRegistry], Any]:
    """The function ``MODULE:FUNCTION`` names, which registers models into a registry."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--models: expected MODULE:FUNCTION, got {spec!r}")
    return getattr(importlib.import_module(module), attr)


def report(wl: Workload, workers: int | None = None, gpu_mb: float | None = None,
           window: int = 6, echo: Callable[[str], Any] = print) -> None:
    """Print the hit-rate table: each eviction policy over the job round-robin and the
    model-hash streams (``workers`` default the workload's count, ``gpu_mb`` its
    smallest GPU)."""
    n = workers or len(wl.cluster.workers)
    cap = gpu_mb or min(w.gpu_mem_mb for w in wl.cluster.workers)
    echo(f"workload {wl.name}: {n} workers x {cap:.0f} MB, window {window}")
    for assign in ("rr", "hash"):
        label = "job round-robin" if assign == "rr" else "model hash"
        streams = task_streams(wl, n, assign)
        echo(f"\n[{label}] policy              hit_rate  loads  tasks")
        for policy, pf in (("lookahead", False), ("lru", False), ("fifo", False),
                           ("lookahead", True)):
            r = replay(streams, wl.models, cap, policy, window, pf)
            name = policy + ("+prefetch" if pf else "")
            echo(f"  {name:<28}{r['hit_rate']:>8.3f}{r['loads']:>7}{r['tasks']:>7}")


def report_load_times(spec: str, echo: Callable[[str], Any] = print) -> None:
    """Register the models ``spec`` (``MODULE:FUNCTION``) names and print their measured
    CPU load time per MB."""
    registry = ModelRegistry()
    registrar(spec)(registry)
    echo("\nreal CPU load time of the registered models (build + to('cpu')), measured:")
    for name, (mb, ms_per_mb) in cpu_load_ms_per_mb(registry).items():
        echo(f"  {name:<18}{mb:>8.1f} MB {ms_per_mb:>8.2f} ms/MB")
