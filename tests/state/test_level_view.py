"""A decision at a priority level plans on the carried view with only the rows that level
sees differently rewritten: the same placement as on a view built afresh for that level,
without building one (nor leaving the cache holding it)."""

from __future__ import annotations

import time

from compass_celery.needs import TaskNeeds
from compass_celery.placement import decide
from compass_celery.planner import get_policy
from compass_celery.planner.compass import plan_job
from compass_celery.planner.cost import build_worker_arrays, worker_arrays
from compass_celery.planner.priority import for_priority
from compass_celery.planner.types import ClusterView, DagSpec, WorkerView
from compass_celery.state import views
from compass_celery.state.store import Snapshot

SIZES = {"a": 500.0, "b": 900.0}


def _workers(n: int) -> tuple[WorkerView, ...]:
    """Workers with work queued at levels 0 and 6 (a task at 3 skips the level-0 part
    of some), in an order other than by name."""
    out = [WorkerView(name=f"w{i:03d}", queue=f"q.w{i:03d}", gpu_total_mb=2000.0,
                      gpu_free_mb=1200.0, resident=frozenset("ab"[: i % 3]),
                      backlog_ms=40.0 + 30.0 * (i % 5),
                      queued_ms={0: 30.0 * (i % 5), 6: 40.0} if i % 5 else {6: 40.0},
                      pending_ms=10.0 * (i % 2), pending_queued_ms={0: 10.0 * (i % 2)},
                      heartbeat=time.time())
           for i in range(n)]
    return tuple(out[5:] + out[:5])


def _fresh(snap: Snapshot, level: int, needs: TaskNeeds):
    """What the decision was before: a view built afresh of the level's workers."""
    view = ClusterView.of(for_priority(snap.workers, level), SIZES, snap.taken_at)
    return plan_job(get_policy("compass"), DagSpec.single(needs.spec(True)), view), view


def test_a_level_decision_places_as_on_a_fresh_view_without_building_one() -> None:
    snap = Snapshot(workers=_workers(24), taken_at=time.time())
    policy = get_policy("compass")
    needs = TaskNeeds(task="t", model="a", exec_ms=20.0, output_kb=0.0,
                      exec_source="declared")
    decide(needs, snap, policy, SIZES, "shared", priority=0)  # the base view, built once
    built = views._VIEWS.built
    for level in (3, 7, 0, 3):
        got = decide(needs, snap, policy, SIZES, "shared", priority=level)
        plan, fresh = _fresh(snap, level, needs)
        want = plan.placements["t"]
        assert (got.worker, got.est_finish_ms, got.wait_ms, got.load_ms) == \
            (want.worker, want.finish_ms, want.wait_ms, want.load_ms)
    assert views._VIEWS.built == built  # every level planned on the carried view


def test_the_level_view_has_the_columns_a_fresh_one_would() -> None:
    snap = Snapshot(workers=_workers(40), taken_at=time.time())
    base = views.cluster_view(snap, SIZES)
    for level in (3, 7):
        workers = for_priority(snap.workers, level)
        assert workers is not snap.workers
        got = views.level_view(base, snap.workers, workers)
        want = build_worker_arrays(ClusterView.of(workers, SIZES, snap.taken_at))
        have = worker_arrays(got)
        assert have.names == want.names
        for col in ("backlog_ms", "pending_ms", "gpu_free_mb", "speed"):
            assert (getattr(have, col) == getattr(want, col)).all(), col
        assert got.workers == tuple(sorted(workers, key=lambda w: w.name))
        # the base view is left as it was: a lowest-level decision plans on it
        assert (worker_arrays(base).backlog_ms
                == build_worker_arrays(ClusterView.of(snap.workers, SIZES)).backlog_ms).all()
