"""The numpy cost path equals the plain scalar reference, worker by worker."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass_celery.planner import ClusterView, DagSpec, TaskSpec, get_policy
from compass_celery.planner.cost import (
    EVICTION_PENALTY,
    build_worker_arrays,
    left_share,
    load_ms,
    scalar_costs,
    transfer_ms,
    with_rows,
    worker_arrays,
)
from compass_celery.planner.pending import pending_work
from compass_celery.planner.types import ModelDemand
from compass_celery.planner.walk import Walk

from .strategies import MODEL_NAMES, clusters, tasks, worker

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(cluster=clusters(), preds=st.lists(tasks(), max_size=3), succ=tasks("s"), data=st.data())
def test_numpy_estimate_equals_scalar_reference(
    cluster: ClusterView, preds: list[TaskSpec], succ: TaskSpec, data: st.DataObject
) -> None:
    pred_tasks = [TaskSpec(f"p{k}", t.model, t.exec_ms, t.output_kb) for k, t in enumerate(preds)]
    nodes = {t.name: t for t in pred_tasks} | {"s": succ}
    dag = DagSpec(nodes, tuple((t.name, "s") for t in pred_tasks))
    walk = Walk(dag, cluster)
    n = len(cluster.workers)
    for t in pred_tasks:  # place predecessors anywhere that fits: it changes the state
        est = walk.estimate(t.name)
        walk.commit(t.name, data.draw(st.sampled_from(list(np.flatnonzero(est.mask)))), est, "")
    inputs = [
        (walk.finish[t.name], walk.arr.names[walk.worker[t.name]], t.output_kb) for t in pred_tasks
    ]
    before = (walk.avail.copy(), walk.free.copy(), walk.loader.copy())
    ends = walk.arr.loads_ahead(cluster.model_sizes_mb, cluster.now)[1]
    est = walk.estimate("s")
    size = walk.sizes["s"]
    for i, w in enumerate(cluster.workers):
        resident = succ.model is None or (walk.load_columns(succ.model, size)[0][i] == 0.0)
        ref = scalar_costs(
            succ.exec_ms,
            size,
            w,
            available_ms=float(before[0][i]),
            free_mb=float(before[1][i]),
            resident=resident,
            host_resident=succ.model in w.host_resident,
            inputs=inputs,
            loading=w.loading.get(succ.model) if succ.model is not None else None,
            now=cluster.now,
            loader_free_ms=float(before[2][i]),
            queued_ms=ends.get((i, succ.model), 0.0) if succ.model is not None else 0.0,
        )
        got = (est.ready[i], est.load[i], est.transfer[i], est.run[i], est.start[i], est.finish[i])
        want = (ref.ready, ref.load, ref.transfer, ref.run, ref.start, ref.finish)
        assert tuple(map(float, got)) == want, (i, got, want)
    assert len(est.finish) == n


@FAST
@given(cluster=clusters(), model=st.sampled_from(MODEL_NAMES))
def test_load_term_equals_scalar(cluster: ClusterView, model: str) -> None:
    arr = worker_arrays(cluster)
    j = arr.models[model]
    size = cluster.model_sizes_mb[model]
    vec = load_ms(
        size,
        arr.resident[:, j],
        arr.host_resident[:, j],
        arr.gpu_free_mb,
        arr.load_mb_per_s,
        arr.host_load_mb_per_s,
    )
    for i, w in enumerate(cluster.workers):
        ref = scalar_costs(
            0.0,
            size,
            w,
            available_ms=0.0,
            free_mb=w.gpu_free_mb,
            resident=model in w.resident,
            host_resident=model in w.host_resident,
        )
        assert float(vec[i]) == ref.load


def test_load_cases_by_hand() -> None:
    gpu, host, none = np.array([True]), np.array([True]), np.array([False])
    free, bw, hbw = np.array([10000.0]), np.array([1000.0]), np.array([10000.0])
    assert load_ms(2000.0, gpu, host, free, bw, hbw)[0] == 0.0
    assert load_ms(2000.0, none, host, free, bw, hbw)[0] == 200.0  # from host RAM
    assert load_ms(2000.0, none, none, free, bw, hbw)[0] == 2000.0  # from storage
    tight = np.array([1000.0])
    assert load_ms(2000.0, none, none, tight, bw, hbw)[0] == 2000.0 * EVICTION_PENALTY


def test_transfer_units() -> None:
    assert transfer_ms(np.array([1000.0]), np.array([1.0]))[0] == 1000.0  # 1 MB at 1 MB/s


def test_arrays_are_built_once_per_snapshot() -> None:
    c = ClusterView.of([worker("a"), worker("b")], {"m": 1.0})
    assert worker_arrays(c) is worker_arrays(c)
    twin = ClusterView.of(c.workers, c.model_sizes_mb)
    assert worker_arrays(twin) is not worker_arrays(c)


@FAST
@given(old=clusters(min_workers=2, max_workers=14), new=clusters(min_workers=2, max_workers=14),
       data=st.data())
def test_rewriting_rows_equals_building_afresh(
    old: ClusterView, new: ClusterView, data: st.DataObject
) -> None:
    """with_rows, told the rows' old views or not, gives the columns a full build gives;
    columns and memos of what did not change are shared, the original stays as it was."""
    n = min(len(old.workers), len(new.workers))
    base = ClusterView(old.workers[:n], old.model_sizes_mb)
    arrays = worker_arrays(base)
    for model, size in base.model_sizes_mb.items():  # fill the memos
        arrays.load_columns(model, size)
        arrays.fits(size)
    before_backlog = arrays.backlog_ms.copy()
    picked = data.draw(st.sets(st.integers(0, n - 1), min_size=1))
    rows = {}
    for j in picked:  # a new view of the same worker: its name and queue kept
        w = new.workers[j]
        if data.draw(st.booleans()):  # or only a backlog charge, as routing makes
            w = replace(base.workers[j], backlog_ms=base.workers[j].backlog_ms + 5.0)
        rows[j] = replace(w, name=base.workers[j].name, queue=base.workers[j].queue)
    workers = list(base.workers)
    for j, w in rows.items():
        workers[j] = w
    want = build_worker_arrays(ClusterView(tuple(workers), base.model_sizes_mb))
    for told in (True, False):
        got = with_rows(arrays, rows, {j: base.workers[j] for j in rows} if told else None)
        for f in fields(want):
            if not f.name.startswith("_"):
                a, b = getattr(got, f.name), getattr(want, f.name)
                assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, f.name
        for model, size in base.model_sizes_mb.items():  # memos answer for the new rows
            fresh = want.load_columns(model, size)
            assert all(np.array_equal(a, b)
                       for a, b in zip(got.load_columns(model, size), fresh, strict=True))
            assert np.array_equal(got.fits(size), want.fits(size))
        if not np.array_equal(want.gpu_free_mb, arrays.gpu_free_mb):
            assert got.gpu_free_mb is not arrays.gpu_free_mb
        else:
            assert got.gpu_free_mb is arrays.gpu_free_mb  # unchanged: shared, not copied
    assert np.array_equal(arrays.backlog_ms, before_backlog)  # the original is untouched


def test_a_backlog_charge_copies_one_column_and_keeps_the_memos() -> None:
    c = ClusterView.of([worker("a", resident=frozenset({"m"})), worker("b")], {"m": 1000.0})
    arrays = worker_arrays(c)
    cols = arrays.load_columns("m", 1000.0)
    charged = replace(c.workers[1], backlog_ms=40.0)
    got = with_rows(arrays, {1: charged}, {1: c.workers[1]})
    assert got.backlog_ms.tolist() == [0.0, 40.0] and arrays.backlog_ms.tolist() == [0.0, 0.0]
    assert got.gpu_free_mb is arrays.gpu_free_mb and got.resident is arrays.resident
    assert got.load_columns("m", 1000.0) is cols  # the load memo is still right: kept
    loaded = replace(c.workers[1], resident=frozenset({"m"}))
    moved = with_rows(arrays, {1: loaded}, {1: c.workers[1]})
    assert moved.load_columns("m", 1000.0)[0].tolist() == [0.0, 0.0]  # memo rebuilt


def test_charges_alone_rewrite_the_backlog_and_planned_work_columns() -> None:
    """Views that differ by a router's own charges (backlog, planned work, their levels)
    take the short way and give what a full build gives; a view that also changed
    anything else takes the long way, with the same answer."""
    c = ClusterView.of([worker("a", resident=frozenset({"m"})), worker("b"), worker("c")],
                       {"m": 1000.0})
    arrays = worker_arrays(c)
    arrays.mean("speed", inverse=True)
    charged = {1: replace(c.workers[1], backlog_ms=40.0, queued_ms={5: 40.0}),
               2: replace(c.workers[2], pending_ms=7.0, pending_queued_ms={5: 7.0})}
    freed = {1: replace(charged[1], gpu_free_mb=1.0)}  # not a charge: the long way
    for rows in (charged, freed):
        got = with_rows(arrays, rows, {j: c.workers[j] for j in rows})
        want = build_worker_arrays(ClusterView(
            tuple(rows.get(j, w) for j, w in enumerate(c.workers)), c.model_sizes_mb))
        for f in fields(want):
            if not f.name.startswith("_"):
                a, b = getattr(got, f.name), getattr(want, f.name)
                assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, f.name
        assert got.resident is arrays.resident  # unchanged: shared
        assert got.backlog_left_ms(0.0).tolist() == want.backlog_ms.tolist()
    assert arrays.backlog_ms.tolist() == [0.0, 0.0, 0.0]  # the original is untouched
    assert arrays.pending_ms.tolist() == [0.0, 0.0, 0.0]


def _one_worker(backlog_ms: float, free_mb: float, sizes: dict[str, float]) -> ClusterView:
    from compass_celery.planner import WorkerView
    w = WorkerView(name="w0", queue="q.w0", gpu_total_mb=4000.0, gpu_free_mb=free_mb,
                   backlog_ms=backlog_ms, load_mb_per_s=1000.0)
    return ClusterView.of([w], sizes)


def test_a_load_that_fits_is_made_while_the_task_waits() -> None:
    """The worker prefetches into free memory while the queue ahead runs: the plan's
    estimate counts only the rest of the load, the choice still the whole of it."""
    from compass_celery.planner import CompassPolicy

    task = TaskSpec("t", "a", exec_ms=10.0)
    for backlog, hidden in ((300.0, 200.0), (50.0, 50.0), (0.0, 0.0)):
        p = CompassPolicy().plan(DagSpec.single(task), _one_worker(backlog, 4000.0, {"a": 200.0})
                                 ).placements["t"]
        assert (p.prefetch_ms, p.load_ms) == (hidden, 200.0 - hidden)
        assert p.finish_ms == backlog + (200.0 - hidden) + 10.0
    # no free memory: the load evicts when the task's turn comes; nothing is hidden
    p = CompassPolicy().plan(DagSpec.single(task), _one_worker(300.0, 100.0, {"a": 200.0})
                             ).placements["t"]
    assert p.prefetch_ms == 0.0 and p.load_ms == 200.0 * EVICTION_PENALTY


def test_one_worker_loads_one_model_at_a_time() -> None:
    """Two loads planned onto one worker: the second prefetch starts when the first ends,
    so less of it hides in the wait."""
    from compass_celery.planner import CompassPolicy

    dag = DagSpec(nodes={"x": TaskSpec("x", "a", exec_ms=10.0),
                         "y": TaskSpec("y", "c", exec_ms=10.0)}, edges=(), name="two")
    view = _one_worker(250.0, 4000.0, {"a": 200.0, "c": 200.0})
    first, second = sorted(CompassPolicy().plan(dag, view).placements.values(),
                           key=lambda p: p.start_ms)
    assert (first.start_ms, first.prefetch_ms, first.finish_ms) == (250.0, 200.0, 260.0)
    # its load runs from 200 ms (the first load's end) while it waits until 260 ms
    assert (second.start_ms, second.prefetch_ms, second.load_ms) == (260.0, 60.0, 140.0)
    assert second.finish_ms == 260.0 + 140.0 + 10.0


def test_a_workers_hop_comes_before_each_start_and_with_each_charge() -> None:
    """Two chained tasks on one worker with a 4 ms hop: each starts a hop after its
    worker is free (the first on an idle worker too), and what each leaves waiting
    charges its run and its hop."""
    cluster = ClusterView.of([worker("w", hop_ms=4.0, resident=frozenset({"m"}))], {"m": 100.0})
    dag = DagSpec({"a": TaskSpec("a", "m", 30.0), "b": TaskSpec("b", "m", 20.0)},
                  (("a", "b"),))
    plan = get_policy("compass").plan(dag, cluster)
    a, b = plan.placements["a"], plan.placements["b"]
    assert (a.start_ms, a.wait_ms, a.finish_ms, a.hop_ms) == (4.0, 4.0, 34.0, 4.0)
    assert (b.start_ms, b.finish_ms) == (38.0, 58.0)
    assert pending_work(plan.placements, {"b": ["a"]}) == {"b": ("w", 24.0)}


def test_a_load_under_way_counts_only_what_is_left_of_it_after_the_start():
    # a 1,500 MB model at 1,500 MB/s: a 1,000 ms load, a quarter done at the snapshot
    loading = worker("a", gpu_total_mb=4000.0, gpu_free_mb=500.0, backlog_ms=200.0,
                     loading={"big": (0.0, 4.0)})
    idle = worker("b", gpu_total_mb=4000.0)
    cluster = ClusterView.of([loading, idle], {"big": 1500.0}, now=1.0,
                             demand={"big": ModelDemand(500.0, 5.0)})
    assert left_share(0.0, 4.0, 1.0) == 0.75 and left_share(0.0, 4.0, 9.0) == 0.0
    dag = DagSpec.single(TaskSpec("t", "big", exec_ms=50.0))
    walk = Walk(dag, cluster)
    est = walk.estimate("t")
    # 750 ms left, 200 of them while the backlog runs; the idle worker loads it whole
    assert est.load.tolist() == [550.0, 1000.0] and est.finish.tolist() == [800.0, 1050.0]
    walk.commit("t", 0, est, "")
    assert walk.free[0] == 500.0  # its memory was taken when the load began
    plan = get_policy("compass").plan(dag, cluster)  # and nothing is evicted for it
    assert plan.placements["t"].worker == "a" and plan.placements["t"].load_ms == 550.0


def test_a_new_load_waits_for_the_loads_under_way_on_its_worker():
    # a worker just started on a preload hint: "big" (1,000 ms) loading, a quarter done,
    # then "mid" (500 ms) queued behind it. It loads one model at a time, so a task
    # needing "small" (100 ms) there starts its load once both are in: 750 + 500 ms on.
    started = worker("a", gpu_total_mb=4000.0,
                     loading={"big": (0.0, 4.0), "mid": (4.0, 6.0)})
    idle = worker("b", gpu_total_mb=4000.0)
    sizes = {"big": 1500.0, "mid": 750.0, "small": 150.0}
    cluster = ClusterView.of([started, idle], sizes, now=1.0)
    busy, ends = worker_arrays(cluster).loads_ahead(sizes, 1.0)
    assert busy.tolist() == [1250.0, 0.0]
    assert ends == {(0, "big"): 750.0, (0, "mid"): 1250.0}
    walk = Walk(DagSpec.single(TaskSpec("t", "small", exec_ms=50.0)), cluster)
    est = walk.estimate("t")
    assert est.load.tolist() == [1350.0, 100.0] and est.finish.tolist() == [1400.0, 150.0]
    # a task for the queued model waits for the load ahead of it too, not only its own
    walk = Walk(DagSpec.single(TaskSpec("t", "mid", exec_ms=50.0)), cluster)
    assert walk.estimate("t").load.tolist() == [1250.0, 500.0]
    plan = get_policy("compass").plan(DagSpec.single(TaskSpec("t", "small", 50.0)), cluster)
    assert plan.placements["t"].worker == "b" and plan.placements["t"].finish_ms == 150.0


def test_a_load_planned_earlier_in_the_plan_holds_the_loader_for_the_next():
    # two tasks on one worker, each with a model to load (100 ms, 200 ms) into free
    # memory: the second's load cannot begin before the first's is in
    w = worker("a", gpu_total_mb=4000.0)
    cluster = ClusterView.of([w], {"m1": 150.0, "m2": 300.0})
    dag = DagSpec({"x": TaskSpec("x", "m1", 10.0), "y": TaskSpec("y", "m2", 10.0)}, ())
    walk = Walk(dag, cluster)
    est = walk.estimate("x")
    walk.commit("x", 0, est, "")
    assert walk.loader.tolist() == [100.0] and walk.finish["x"] == 110.0
    est = walk.estimate("y")  # its prefetch runs while x runs, from x's load's end
    assert float(est.hidden[0]) == 10.0
    walk.commit("y", 0, est, "")
    assert walk.finish["y"] == 100.0 + 200.0 + 10.0  # not 210: the loads do not overlap


@pytest.mark.parametrize("seed", range(15))
def test_loads_ahead_sums_a_few_loads_in_python_as_numpy_does(seed, monkeypatch):
    """A few loads under way are summed in Python floats (the usual case): the same
    numbers, bit for bit, as the numpy pass a cluster full of loads takes (spans past,
    to come, empty and NaN; several loads a worker)."""
    import math
    import random

    from compass_celery.planner import cost

    rng = random.Random(seed)
    sizes = {f"m{j}": float(rng.choice((150, 750, 1500, 3000))) for j in range(6)}
    workers = []
    for i in range(12):
        loading = {}
        for m in rng.sample(sorted(sizes), rng.randint(0, 3)):
            began = rng.uniform(-5.0, 5.0)
            loading[m] = (began, rng.choice((began, began + rng.uniform(0, 8), math.nan)))
        workers.append(worker(f"w{i:02d}", gpu_total_mb=8000.0, loading=loading))
    cluster = ClusterView.of(workers, sizes, now=1.0)
    few = worker_arrays(cluster).loads_ahead(sizes, 1.0)
    monkeypatch.setattr(cost, "_FEW_LOADS", 0)
    many = build_worker_arrays(cluster).loads_ahead(sizes, 1.0)
    assert np.array_equal(few[0], many[0], equal_nan=True)
    assert list(few[1]) == list(many[1])
    assert all(a == b or (a != a and b != b) for a, b in
               zip(few[1].values(), many[1].values(), strict=True))
