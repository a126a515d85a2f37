"""The level cache: a decision above the lowest level plans on the view carried over from
the last one at its level, with only the rows whose snapshot view changed seen again, and
that view is the one ``for_priority`` then ``level_view`` would give, column for column,
through charges, releases that empty the lower levels, fresh records and the race."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from compass_celery.needs import TaskNeeds
from compass_celery.placement import decide
from compass_celery.planner import get_policy
from compass_celery.planner.cost import build_worker_arrays, worker_arrays
from compass_celery.planner.fold import charged
from compass_celery.planner.priority import for_priority
from compass_celery.planner.types import ClusterView, WorkerView
from compass_celery.state import views
from compass_celery.state.store import Snapshot
from compass_celery.state.views import LevelCache, ViewCache, level_view

SIZES = {"a": 500.0, "b": 900.0}
COLUMNS = ("backlog_ms", "pending_ms", "gpu_free_mb", "speed", "hop_ms")


def _workers(n: int, now: float) -> tuple[WorkerView, ...]:
    """Workers with work queued and planned at levels 0 and 6, some running a task that
    is about to end (the race), in an order other than by name."""
    out = [WorkerView(name=f"w{i:03d}", queue=f"q.w{i:03d}", gpu_total_mb=2000.0,
                      gpu_free_mb=1200.0, resident=frozenset("ab"[: i % 3]),
                      backlog_ms=40.0 + 30.0 * (i % 5),
                      queued_ms={0: 30.0 * (i % 5), 6: 40.0} if i % 5 else {6: 40.0},
                      pending_ms=10.0 * (i % 2), pending_queued_ms={0: 10.0 * (i % 2)},
                      running=((now - 0.05, now + 0.001, 40.0),) if i % 4 == 0 else (),
                      hop_ms=5.0, heartbeat=now)
           for i in range(n)]
    return tuple(out[7:] + out[:7])


def _same(got: ClusterView, base: ClusterView, workers: tuple[WorkerView, ...], level: int,
          now: float | None) -> None:
    """``got`` equals what for_priority then level_view give, rows and columns alike."""
    want = level_view(base, workers, for_priority(workers, level, now))
    assert [(w.name, w.backlog_ms, w.pending_ms) for w in got.workers] == \
        [(w.name, w.backlog_ms, w.pending_ms) for w in want.workers]
    have, fresh = worker_arrays(got), build_worker_arrays(
        ClusterView.of(want.workers, SIZES, want.now))
    assert have.names == fresh.names
    for col in COLUMNS:
        assert np.array_equal(getattr(have, col), getattr(fresh, col)), col
    assert (got.now, got.demand) == (base.now, base.demand)


def _step(ws: list[WorkerView], k: int) -> None:
    """One change of the kind a burst makes: a charge at a level (the router's), a
    release, or a fresh record of a worker."""
    i = (7 * k) % len(ws)
    if k % 5 == 4:  # a fresh record: every field may differ
        ws[i] = replace(ws[i], backlog_ms=ws[i].backlog_ms + 3.0, gpu_free_mb=900.0)
    elif k % 3 == 2:  # a start releases its level's queued work
        ws[i] = charged(ws[i], -25.0, level=0)
    else:
        ws[i] = charged(ws[i], 20.0 + k, level=k % 2 * 6)


def test_the_carried_level_view_is_the_one_built_afresh_each_step() -> None:
    now = time.time()
    ws = list(_workers(40, now))
    base_cache, cache = ViewCache(), LevelCache()
    for k in range(60):
        workers = tuple(ws)
        base = base_cache.get(workers, SIZES, now)
        for level, clock in ((3, None), (7, now), (3, None)):
            _same(cache.get(base, workers, level, clock), base, workers, level, clock)
        _step(ws, k)
    assert cache.carried > cache.built  # most steps carried, not rebuilt
    assert cache.get(base, workers, 0, now) is base  # the lowest level: the base view


def test_the_level_view_follows_lower_work_emptied_and_back() -> None:
    now = time.time()
    ws = [replace(w, queued_ms={6: 40.0}, pending_queued_ms={}, backlog_ms=40.0)
          for w in _workers(24, now)]
    ws[3] = charged(ws[3], 30.0, level=0)  # the one worker with lower-level work
    base_cache, cache = ViewCache(), LevelCache()
    for change in (None, -30.0, 15.0, -15.0):
        if change is not None:
            ws[3] = charged(ws[3], change, level=0)
        workers = tuple(ws)
        base = base_cache.get(workers, SIZES, now)
        got = cache.get(base, workers, 5, now)
        _same(got, base, workers, 5, now)
        if not ws[3].queued_ms.get(0):
            assert got is base  # nothing below the level waits: the base view itself


def test_a_burst_at_a_level_places_as_on_views_built_afresh() -> None:
    now = time.time()
    policy = get_policy("compass")
    needs = TaskNeeds(task="t", model="a", exec_ms=20.0, output_kb=0.0,
                      exec_source="declared")
    ws = list(_workers(32, now))
    carried = views._LEVELS.carried
    for _ in range(20):
        snap = Snapshot(workers=tuple(ws), taken_at=now)
        got = decide(needs, snap, policy, SIZES, "shared", priority=6, hold_max_ms=50.0)
        view = level_view(views.cluster_view(snap, SIZES), snap.workers,
                          for_priority(snap.workers, 6, now))
        want = decide(needs, replace(snap, workers=view.workers), policy, SIZES, "shared")
        assert (got.worker, got.est_finish_ms, got.wait_ms) == \
            (want.worker, want.est_finish_ms, want.wait_ms)
        i = next(j for j, w in enumerate(ws) if w.name == got.worker)
        ws[i] = charged(ws[i], got.charge_ms, level=6)  # the router's own charge
    assert views._LEVELS.carried > carried
