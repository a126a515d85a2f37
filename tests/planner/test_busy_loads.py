"""A load on a busy worker is charged again, as the capacity it takes from the tasks
queued behind it (``planner.evict.busy_load_price``): past capacity compass keeps to
resident copies instead of chasing queue imbalances with loads; an idle worker's load
costs what it did."""

from __future__ import annotations

import numpy as np
import pytest

from compass_celery.planner import ClusterView, CompassPolicy, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.adjust import reassign
from compass_celery.planner.evict import BUSY_HORIZON_MS, BUSY_WEIGHT, busy_load_price
from compass_celery.planner.types import ModelDemand

SIZES = {"hot": 500.0, "d": 500.0, "e": 500.0, "f": 500.0}
TASK = TaskSpec("t", "hot", 50.0)


def w(name: str, resident: set[str], backlog: float) -> WorkerView:
    """A full 1,000 MB GPU (a load must evict: twice 500 ms, none of it hidden)."""
    return WorkerView(name, name, 1000.0, 1000.0 - 500.0 * len(resident), frozenset(resident),
                      backlog_ms=backlog, load_mb_per_s=1000.0)


def cluster(cold_backlog: float) -> ClusterView:
    """``hot`` resident on w0 behind 1.8 s of work; w1 holds models nobody asks for
    (evicting them is free) behind ``cold_backlog``."""
    workers = (w("w0", {"hot", "f"}, 1800.0), w("w1", {"d", "e"}, cold_backlog))
    return ClusterView.of(workers, SIZES, demand={"hot": ModelDemand(400.0, 8.0)})


def test_price_is_the_unhidden_load_scaled_by_how_busy_the_worker_is() -> None:
    load = np.array([400.0, 400.0, 400.0, 400.0, 0.0])
    hidden = np.array([0.0, 0.0, 0.0, 100.0, 0.0])
    avail = np.array([0.0, BUSY_HORIZON_MS / 2, 10 * BUSY_HORIZON_MS, 10 * BUSY_HORIZON_MS,
                      10 * BUSY_HORIZON_MS])
    got = busy_load_price(load, hidden, avail)
    assert got == pytest.approx(np.array([0.0, 200.0, 400.0, 300.0, 0.0]) * BUSY_WEIGHT)
    assert busy_load_price(load, None, avail)[3] == pytest.approx(400.0 * BUSY_WEIGHT)


def test_a_busy_cold_worker_loses_to_the_resident_copy() -> None:
    dag = DagSpec.single(TASK)
    # 600 ms queued plus a 1 s load finishes before 1.8 s queued: earliest finish alone
    # loads; the load's time is taken from the 600 ms queue's successors, so it stays
    plan = CompassPolicy().plan(dag, cluster(600.0))
    assert plan.worker_of("t") == "w0"
    assert plan.placements["t"].load_ms == 0.0


def test_an_idle_cold_worker_still_loads() -> None:
    plan = CompassPolicy().plan(DagSpec.single(TASK), cluster(0.0))
    assert plan.worker_of("t") == "w1"
    assert plan.placements["t"].load_ms > 0.0


def test_a_successor_is_not_moved_onto_a_busy_cold_worker() -> None:
    assert reassign(TASK, "w0", cluster(600.0), {}) is None
    moved = reassign(TASK, "w0", cluster(0.0), {})
    assert moved is not None and moved.worker == "w1"
