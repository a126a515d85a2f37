"""How long planning takes: one task, and a 10-task DAG, at 4/64/1000 workers (any counts).

Synthetic, seeded workers (each holding 0-3 of a 20-model catalogue, random backlog) and
``time.perf_counter_ns`` around the policy's ``plan`` (compass unless ``--policies``).
"cold" plans every call on a new snapshot object, so the per-worker columns are rebuilt
inside the timed call (a router that just read fresh state); "live" plans on a new
snapshot whose columns were handed over ready (``remember_arrays``), as the simulator
does for every job, so only the model-dependent memo is rebuilt; "warm" re-plans on one
snapshot, whose columns are memoised (a router within its snapshot cache window).
"live" is opt-in (``--snapshots cold,live,warm``). Prints median and p99 in
microseconds. Pure CPU, no GPU, no Redis.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from compass_celery.planner import (
    ClusterView,
    DagSpec,
    Policy,
    TaskSpec,
    WorkerView,
    get_policy,
)
from compass_celery.planner.cost import remember_arrays
from compass_celery.sim.columns import LiveColumns

MODELS = {f"m{k:02d}": 500.0 + 275.0 * k for k in range(20)}  # 0.5 GB .. 5.7 GB


def synthetic_cluster(n: int, rng: random.Random) -> ClusterView:
    """n workers with random resident models, backlog and speed."""
    names = list(MODELS)
    workers = []
    for i in range(n):
        resident = frozenset(rng.sample(names, rng.randint(0, 3)))
        used = sum(MODELS[m] for m in resident)
        workers.append(
            WorkerView(
                name=f"w{i:04d}",
                queue=f"compass.w{i:04d}",
                gpu_total_mb=16000.0,
                gpu_free_mb=16000.0 - used,
                resident=resident,
                backlog_ms=rng.uniform(0.0, 500.0),
                speed=rng.choice((0.5, 1.0, 1.0, 2.0)),
            )
        )
    return ClusterView.of(workers, MODELS)


def ten_task_dag(rng: random.Random) -> DagSpec:
    """A fan-out / fan-in job: 1 -> 4 -> 1 -> 3 -> 1 (10 nodes)."""
    names = list(MODELS)
    layers = [["a"], ["b0", "b1", "b2", "b3"], ["c"], ["d0", "d1", "d2"], ["e"]]
    nodes = {
        n: TaskSpec(n, rng.choice(names), rng.uniform(25, 800), rng.uniform(0, 2000))
        for layer in layers
        for n in layer
    }
    edges = tuple(
        (a, b) for up, down in zip(layers, layers[1:], strict=False) for a in up for b in down
    )
    return DagSpec(nodes, edges, name="ten")


def live_snapshots(cluster: ClusterView, reps: int) -> list[ClusterView]:
    """New snapshot objects whose columns are ready, as the simulator hands them over."""
    live = LiveColumns(cluster.workers, cluster.model_sizes_mb)
    out = []
    for _ in range(reps):
        snap = ClusterView(cluster.workers, cluster.model_sizes_mb)
        remember_arrays(snap, live.arrays())
        out.append(snap)
    return out


def time_us(
    policy: Policy, dag: DagSpec, snapshots: Sequence[ClusterView]
) -> tuple[float, float]:
    """(median, p99) in microseconds of planning ``dag`` once per snapshot given."""
    samples = []
    for cluster in snapshots:
        t0 = time.perf_counter_ns()
        policy.plan(dag, cluster)
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(0.99 * len(samples)))]


#: The snapshot cases ``--snapshots`` takes.
SNAPSHOTS = ("cold", "live", "warm")


def run(worker_counts: Sequence[int], names: Sequence[str], kinds: Sequence[str],
        reps: int = 500, seed: int = 0, echo: Callable[[str], Any] = print) -> None:
    """Time each policy's plan of one task and of a 10-task DAG at each worker count, on
    each kind of snapshot (:data:`SNAPSHOTS`); print median and p99 in microseconds."""
    rng = random.Random(seed)
    single = DagSpec.single(TaskSpec("t", "m07", 120.0, 100.0))
    dag = ten_task_dag(rng)
    echo(f"{'workers':>8} {'case':>8} {'snapshot':>8} {'median_us':>10} {'p99_us':>10} "
         f"{'policy':>14}")
    for n in worker_counts:
        cluster = synthetic_cluster(n, rng)
        n_reps = max(50, reps * 64 // max(n, 64))
        for name in names:
            policy = get_policy(name, seed=seed)
            for case, d in (("1-task", single), ("10-task", dag)):
                for _ in range(10):
                    policy.plan(d, cluster)  # warm-up: imports, caches, branch predictors
                for kind in kinds:
                    if kind == "cold":
                        snapshots = [ClusterView(cluster.workers, cluster.model_sizes_mb)
                                     for _ in range(n_reps)]
                    elif kind == "live":
                        snapshots = live_snapshots(cluster, n_reps)
                    else:
                        snapshots = [cluster] * n_reps
                    med, p99 = time_us(policy, d, snapshots)
                    echo(f"{n:>8} {case:>8} {kind:>8} {med:>10.1f} {p99:>10.1f} {name:>14}")
