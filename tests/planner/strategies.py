"""Hypothesis strategies and small builders for planner tests: clusters, DAGs, tasks."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from compass_celery.planner import ClusterView, DagSpec, TaskSpec, WorkerView

MODEL_NAMES = ("m0", "m1", "m2", "m3", "m4")
SMALLEST_GPU_MB = 4000.0


def worker(name: str, **kw: object) -> WorkerView:
    """A 16 GB worker, idle and empty unless told otherwise."""
    kw.setdefault("gpu_total_mb", 16000.0)
    kw.setdefault("gpu_free_mb", kw["gpu_total_mb"])
    return WorkerView(name=name, queue=f"q.{name}", **kw)  # type: ignore[arg-type]


@st.composite
def catalogues(draw: st.DrawFn) -> dict[str, float]:
    """Model sizes that fit the smallest GPU, so every task has somewhere to go."""
    sizes = st.floats(50.0, SMALLEST_GPU_MB, allow_nan=False)
    return {m: draw(sizes) for m in MODEL_NAMES}


@st.composite
def clusters(draw: st.DrawFn, *, min_workers: int = 1, max_workers: int = 6) -> ClusterView:
    models = draw(catalogues())
    n = draw(st.integers(min_workers, max_workers))
    workers = []
    for i in range(n):
        total = draw(st.sampled_from((SMALLEST_GPU_MB, 8000.0, 16000.0)))
        resident = frozenset(draw(st.sets(st.sampled_from(MODEL_NAMES), max_size=3)))
        loading = {m: (began, began + draw(st.sampled_from((0.0, 50.0, 400.0))))
                   for m in draw(st.sets(st.sampled_from(MODEL_NAMES), max_size=2)) - resident
                   for began in [draw(st.floats(0.0, 300.0))]}
        workers.append(
            worker(
                f"w{i}",
                gpu_total_mb=total,
                gpu_free_mb=draw(st.floats(0.0, total)),
                resident=resident,
                loading=loading,
                running=tuple((b, b + d, c) for b, d, c in draw(st.lists(st.tuples(
                    st.floats(0.0, 400.0), st.sampled_from((0.0, 1.0, 250.0)),
                    st.sampled_from((0.0, 30.0, 600.0))), max_size=2))),
                host_resident=frozenset(draw(st.sets(st.sampled_from(MODEL_NAMES), max_size=3))),
                backlog_ms=draw(st.floats(0.0, 2000.0)),
                pending_ms=draw(st.floats(0.0, 300.0)),
                speed=draw(st.sampled_from((0.5, 1.0, 2.0))),
                hop_ms=draw(st.sampled_from((0.0, 3.5, 12.0))),
                load_mb_per_s=draw(st.floats(200.0, 4000.0)),
                host_load_mb_per_s=draw(st.floats(4000.0, 20000.0)),
                net_mb_per_s=draw(st.floats(10.0, 2000.0)),
            )
        )
    return ClusterView.of(workers, models, now=draw(st.floats(0.0, 500.0)))


@st.composite
def tasks(draw: st.DrawFn, name: str = "t") -> TaskSpec:
    return TaskSpec(
        name=name,
        model=draw(st.one_of(st.none(), st.sampled_from(MODEL_NAMES))),
        exec_ms=draw(st.floats(0.0, 800.0)),
        output_kb=draw(st.floats(0.0, 50000.0)),
    )


@st.composite
def dags(draw: st.DrawFn, *, max_nodes: int = 7) -> DagSpec:
    """A random DAG: edges only from lower to higher index, so never a cycle."""
    n = draw(st.integers(1, max_nodes))
    names = [f"n{i}" for i in range(n)]
    nodes = {nm: draw(tasks(nm)) for nm in names}
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=10)) if pairs else []
    return DagSpec(nodes, tuple(edges), name="g")


def free_of_costs(cluster: ClusterView) -> ClusterView:
    """Same workers, every model resident everywhere and no backlog: load costs nothing."""
    every = frozenset(cluster.model_sizes_mb)
    workers = [
        WorkerView(
            name=w.name,
            queue=w.queue,
            gpu_total_mb=w.gpu_total_mb,
            gpu_free_mb=w.gpu_free_mb,
            resident=every,
            speed=w.speed,
        )
        for w in cluster.workers
    ]
    return ClusterView.of(workers, cluster.model_sizes_mb)


def without_outputs(dag: DagSpec) -> DagSpec:
    nodes = {n: TaskSpec(t.name, t.model, t.exec_ms, 0.0) for n, t in dag.nodes.items()}
    return DagSpec(nodes, dag.edges, dag.name)


def random_instance(rng: random.Random, *, max_nodes: int = 8) -> tuple[DagSpec, ClusterView]:
    """A seeded (not hypothesis-driven) DAG and cluster, for statements about averages."""
    models = {m: rng.uniform(50.0, SMALLEST_GPU_MB) for m in MODEL_NAMES}
    workers = []
    for i in range(rng.randint(2, 6)):
        total = rng.choice((SMALLEST_GPU_MB, 8000.0, 16000.0))
        workers.append(
            worker(
                f"w{i}",
                gpu_total_mb=total,
                gpu_free_mb=rng.uniform(0.0, total),
                resident=frozenset(rng.sample(MODEL_NAMES, rng.randint(0, 3))),
                backlog_ms=rng.uniform(0.0, 2000.0),
                speed=rng.choice((0.5, 1.0, 2.0)),
                load_mb_per_s=rng.uniform(200.0, 4000.0),
                net_mb_per_s=rng.uniform(10.0, 2000.0),
            )
        )
    names = [f"n{i}" for i in range(rng.randint(1, max_nodes))]
    nodes = {
        n: TaskSpec(n, rng.choice((None, *MODEL_NAMES)), rng.uniform(0, 800), rng.uniform(0, 5e4))
        for n in names
    }
    edges = tuple((a, b) for i, a in enumerate(names) for b in names[i + 1 :] if rng.random() < 0.3)
    return DagSpec(nodes, edges), ClusterView.of(workers, models)
