"""A producer's own planned loads folded into the snapshot it plans on
(``planner.residency``): the next plan on the same stale view sees the load under way
and the models it evicts gone; the simulator's stale view folds them the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass_celery.planner import ClusterView, CompassPolicy, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.compass import plan_job
from compass_celery.planner.cost import evolve, remember_arrays, with_rows, worker_arrays
from compass_celery.planner.fold import fold_plan, planned_load
from compass_celery.sim.runner import simulate
from compass_celery.workload import load_workload

DAGS = Path(__file__).resolve().parents[2] / "dags"

SIZES = {"a": 400.0, "b": 400.0, "big": 700.0}


def worker(name: str, resident: set[str], gpu: float = 1000.0,
           backlog: float = 0.0) -> WorkerView:
    used = sum(SIZES[m] for m in resident)
    return WorkerView(name, name, gpu, gpu - used, frozenset(resident), backlog_ms=backlog,
                      load_mb_per_s=1000.0)


def folded(cluster: ClusterView, rows: dict[int, WorkerView]) -> ClusterView:
    """``cluster`` with ``rows`` folded in, as the simulator's stale view folds them."""
    workers = list(cluster.workers)
    for i, w in rows.items():
        workers[i] = w
    out = evolve(cluster, workers=tuple(workers))
    remember_arrays(out, with_rows(worker_arrays(cluster), rows,
                                   {i: cluster.workers[i] for i in rows}))
    return out


def test_a_planned_load_into_free_memory_is_under_way_with_its_memory_taken() -> None:
    w = worker("w", {"a"})
    after = planned_load(w, "b", SIZES, now=10.0, ends=60.0)
    assert after.loading == {"b": (10.0, 60.0)}
    assert after.gpu_free_mb == 200.0
    assert after.resident == frozenset({"a"})


def test_a_load_that_needs_room_evicts_the_lowest_ranked_model_only() -> None:
    w = worker("w", {"a", "b"}, gpu=1100.0)  # 300 MB free: one 400 MB model must go
    # b ranks lower (a spare copy) than a: the cache would evict b, and one is enough
    after = planned_load(w, "big", SIZES, now=0.0, ends=5.0,
                         rank={"a": (1.0, 5.0, -400.0), "b": (0.0, 1.0, -400.0)})
    assert after.resident == frozenset({"a"})
    assert after.gpu_free_mb == 0.0  # 1100 - a - big
    assert "big" in after.loading


def test_nothing_is_folded_for_a_resident_model_or_when_no_room_can_be_made() -> None:
    w = worker("w", {"a"})
    assert planned_load(w, "a", SIZES, 0.0, 5.0) is w
    small = worker("s", set(), gpu=300.0)
    assert planned_load(small, "a", SIZES, 0.0, 5.0) is small


def test_the_next_plan_on_the_same_view_sees_the_planned_load_under_way() -> None:
    cluster = ClusterView.of([worker("w1", set()), worker("w2", set())], SIZES)
    dag = DagSpec.single(TaskSpec("t", "a", 100.0))
    first = plan_job(CompassPolicy(), dag, cluster)
    chosen = first.worker_of("t")
    rows = fold_plan(cluster, dag.nodes, first.placements)
    assert list(rows) == [[w.name for w in cluster.workers].index(chosen)]
    after = folded(cluster, rows)
    i = next(iter(rows))
    assert worker_arrays(after).is_loading("a", i)
    # a second job for the model waits for that load rather than loading a second copy
    second = plan_job(CompassPolicy(), dag, after)
    assert second.worker_of("t") == chosen
    assert second.placements["t"].load_ms < first.placements["t"].load_ms + 1e-9
    assert fold_plan(after, dag.nodes, second.placements) == {}


def test_the_simulator_folds_only_on_a_stale_view_and_it_saves_loads_and_time() -> None:
    wl = load_workload(DAGS / "caption-translate.json")
    fresh = simulate(wl, ["compass"], refresh_ms=0.0)["policies"]["compass"]
    stale = simulate(wl, ["compass"], refresh_ms=400.0)["policies"]["compass"]
    assert fresh["model_loads"] == 9  # as before folding: a fresh view has nothing to fold
    assert stale["model_loads"] <= 14  # 22 without the fold
    # its own charges and loads folded, a 400 ms-old view plans nearly as well as a fresh
    # one (1.08x here; 1.90x with neither folded)
    assert stale["latency_ms"]["mean"] <= 1.2 * fresh["latency_ms"]["mean"]


def test_every_producers_planned_loads_fold_as_ones_own_up_to_their_end() -> None:
    from compass_celery.planner.cost import left_share
    from compass_celery.planner.fold import fold_planned

    ws = (worker("w1", {"a"}), worker("w2", set()))
    now = 100.0
    planned = {"w1": {"a": now + 9.0, "b": now + 0.1, "gone": now + 1.0},
               "w2": {"b": now - 0.5}, "nobody": {"b": now + 3.0}}
    after = fold_planned(ws, planned, SIZES, now)
    # w1: "a" is resident already, "gone" has no size known: only "b" folds, as the
    # producer that planned it folded it (memory taken), and what is left of it is the
    # time to its end (0.1 s of its 0.4 s at 1,000 MB/s)
    assert after[0].resident == frozenset({"a"}) and set(after[0].loading) == {"b"}
    assert after[0].gpu_free_mb == 200.0
    began, ends = after[0].loading["b"]
    assert ends == now + 0.1 and left_share(began, ends, now) == pytest.approx(0.25)
    assert after[1] is ws[1]  # its planned load is over
    assert fold_planned(ws, {"w2": {"b": now - 1.0}}, SIZES, now) is ws
    # a load planned far ahead (the task waits first) counts whole, as one's own does
    far = fold_planned(ws, {"w2": {"b": now + 60.0}}, SIZES, now)[1]
    assert far.loading["b"] == (now, now + 60.0)
