"""A model's learned load time replaces size over bandwidth in every plan."""

from __future__ import annotations

import pytest

from compass_celery.planner.compass import CompassPolicy
from compass_celery.planner.types import ClusterView, DagSpec, TaskSpec, WorkerView

SIZES = {"vad": 2.0, "big": 900.0}


def _workers() -> list[WorkerView]:
    return [WorkerView("a", "q.a", 4000, 4000, load_mb_per_s=1000.0),
            WorkerView("b", "q.b", 4000, 4000, frozenset({"vad"}), load_mb_per_s=1000.0,
                       backlog_ms=100.0)]


def _plan(load_ms: dict[str, float] | None) -> dict:
    dag = DagSpec.single(TaskSpec("t", "vad", exec_ms=10.0))
    cluster = ClusterView.of(_workers(), SIZES, load_ms=load_ms)
    return CompassPolicy().plan(dag, cluster).placements


def test_size_over_bandwidth_without_a_learned_time():
    p = _plan(None)["t"]
    assert p.load_ms == pytest.approx(2.0)  # 2 MB at 1,000 MB/s


def test_a_learned_load_time_is_counted_and_changes_the_choice():
    # b holds the model behind a 100 ms queue. By size the 2 MB model loads on a in
    # 2 ms: a. Learned, a load takes 300 ms: b, where the queue is shorter than the load
    assert _plan(None)["t"].worker == "a"
    assert _plan({"vad": 300.0})["t"].worker == "b"
    cluster = ClusterView.of(_workers()[:1], SIZES, load_ms={"vad": 300.0})
    alone = CompassPolicy().plan(DagSpec.single(TaskSpec("t", "vad", exec_ms=10.0)), cluster)
    assert alone.placements["t"].load_ms == pytest.approx(300.0)


def test_a_host_tier_copy_still_loads_at_host_bandwidth():
    workers = [WorkerView("a", "q.a", 4000, 4000, host_resident=frozenset({"vad"}),
                          load_mb_per_s=1000.0, host_load_mb_per_s=10000.0)]
    dag = DagSpec.single(TaskSpec("t", "vad", exec_ms=10.0))
    p = CompassPolicy().plan(dag, ClusterView.of(workers, SIZES, load_ms={"vad": 300.0}))
    assert p.placements["t"].load_ms == pytest.approx(0.2)
