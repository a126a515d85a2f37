"""Replay a workload's task stream through CacheDecider: hit rate and loads per policy.

A quick, deterministic check of the eviction policies alone (no planner, no timing):
jobs are drawn from the workload's mix with its seed, each job's tasks go to one
worker (job round-robin, as a collocating planner would) or each task to the worker
its model hashes to, and each worker sees a window of its own upcoming tasks as its
queue. Also measures real CPU load time per MB of the example torch models.

    python -m compass_celery.cache.hitrate --workload dags/edge-vision.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import zlib
from collections.abc import Sequence
from typing import Any

from compass_celery.cache.decisions import CacheDecider, Load

DEFAULT_WORKLOAD = "dags/edge-vision.json"


def _topo(dag: dict[str, Any]) -> list[str]:
    nodes = list(dag["nodes"])
    indeg = {n: 0 for n in nodes}
    for _, b in dag.get("edges", []):
        indeg[b] += 1
    order, ready = [], [n for n in nodes if indeg[n] == 0]
    while ready:
        n = ready.pop(0)
        order.append(n)
        for a, b in dag.get("edges", []):
            if a == n:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
    return order


def task_streams(wl: dict[str, Any], workers: int, assign: str) -> list[list[str]]:
    """Per worker, the models of its tasks in arrival order."""
    arr = wl.get("arrivals", {})
    rng = random.Random(arr.get("seed", 0))
    names, weights = zip(*wl["mix"].items(), strict=True)
    streams: list[list[str]] = [[] for _ in range(workers)]
    for job in range(int(arr.get("jobs", 400))):
        dag = wl["dags"][rng.choices(names, weights)[0]]
        for node in _topo(dag):
            model = dag["nodes"][node].get("model")
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


def cpu_load_ms_per_mb(reps: int = 3) -> dict[str, tuple[float, float]]:
    """Median real load (build + move to cpu, eval) time per MB of each example model."""
    from compass_celery.cache.backends import TorchBackend
    from compass_celery.cache.registry import ModelRegistry
    from workers.models import register_example_models

    reg = ModelRegistry()
    backend = TorchBackend("cpu")
    out = {}
    for name in register_example_models(reg):
        times, mb = [], 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            _, mb = backend.load(name, reg.get(name).loader, reg.get(name).size_mb)
            times.append((time.perf_counter() - t0) * 1000)
            backend.evict(name)
        out[name] = (mb, statistics.median(times) / mb)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--workers", type=int)
    p.add_argument("--gpu-mb", type=float)
    p.add_argument("--window", type=int, default=6, help="queued tasks each worker sees")
    p.add_argument("--no-torch", action="store_true", help="skip the CPU load-time measurement")
    args = p.parse_args(argv)
    with open(args.workload) as f:
        wl = json.load(f)
    cluster = wl.get("cluster", {})
    workers = args.workers or int(cluster.get("workers", 4))
    cap = args.gpu_mb or float(cluster.get("gpu_mem_mb", 1600))
    sizes = {m: float(v["size_mb"]) for m, v in wl["models"].items()}
    print(f"workload {wl.get('name')}: {workers} workers x {cap:.0f} MB, window {args.window}")
    for assign in ("rr", "hash"):
        label = "job round-robin" if assign == "rr" else "model hash"
        streams = task_streams(wl, workers, assign)
        print(f"\n[{label}] policy              hit_rate  loads  tasks")
        for policy, pf in (
            ("lookahead", False),
            ("lru", False),
            ("fifo", False),
            ("lookahead", True),
        ):
            r = replay(streams, sizes, cap, policy, args.window, pf)
            name = policy + ("+prefetch" if pf else "")
            print(f"  {name:<28}{r['hit_rate']:>8.3f}{r['loads']:>7}{r['tasks']:>7}")
    if not args.no_torch:
        print("\nreal CPU load time of the example models (build + to('cpu')), measured:")
        for name, (mb, ms_per_mb) in cpu_load_ms_per_mb().items():
            print(f"  {name:<18}{mb:>8.1f} MB {ms_per_mb:>8.2f} ms/MB")


if __name__ == "__main__":
    main()
