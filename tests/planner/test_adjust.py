"""Adjustment phase: move a ready task only when its planned worker has gone stale."""

from __future__ import annotations

from compass_celery.planner import ClusterView, TaskSpec, reassign

from .strategies import worker

MODELS = {"x": 3000.0}
TASK = TaskSpec("t", "x", 100.0)


def cluster(*workers) -> ClusterView:  # type: ignore[no-untyped-def]
    return ClusterView.of(workers, MODELS)


def test_stays_when_backlog_is_within_factor_of_run_time() -> None:
    c = cluster(worker("a", backlog_ms=150.0), worker("b", resident=frozenset({"x"})))
    assert reassign(TASK, "a", c, {}) is None  # 150 <= 1.5 x 100


def test_moves_when_backlog_is_large_and_another_worker_finishes_sooner() -> None:
    c = cluster(
        worker("a", backlog_ms=5000.0, resident=frozenset({"x"})),
        worker("b", resident=frozenset({"x"}), backlog_ms=10.0),
    )
    moved = reassign(TASK, "a", c, {"a": 100.0})
    assert moved is not None
    assert (moved.worker, moved.queue, moved.finish_ms) == ("b", "q.b", 110.0)
    assert moved.reason.startswith("moved: a backlog 5000ms > 1.5x run 100ms")


def test_stays_when_nobody_is_better_or_gain_is_below_threshold() -> None:
    slow = cluster(worker("a", backlog_ms=1000.0, resident=frozenset({"x"})), worker("b"))
    assert reassign(TASK, "a", slow, {}) is None  # b must load for 2000 ms
    close = cluster(
        worker("a", backlog_ms=300.0, resident=frozenset({"x"})),
        worker("b", backlog_ms=250.0, resident=frozenset({"x"})),
    )
    assert reassign(TASK, "a", close, {}) is not None
    assert reassign(TASK, "a", close, {}, min_gain_ms=60.0) is None


def test_join_moves_only_when_gain_beats_the_extra_transfer() -> None:
    # 100 MB of inputs on a; pulling them to b at 1000 MB/s costs 100 ms
    def c(backlog: float) -> ClusterView:
        return cluster(
            worker("a", backlog_ms=backlog, resident=frozenset({"x"})),
            worker("b", resident=frozenset({"x"})),
        )

    inputs = {"a": 100_000.0}
    assert reassign(TASK, "a", c(180.0), inputs) is not None  # single input: gain 80 > 0
    assert reassign(TASK, "a", c(180.0), inputs, is_join=True) is None  # 80 < 100 extra
    assert reassign(TASK, "a", c(400.0), inputs, is_join=True) is not None  # 300 > 100


def test_a_gone_or_too_small_planned_worker_is_always_replaced() -> None:
    c = cluster(worker("a", gpu_total_mb=1000.0), worker("b"))
    assert reassign(TASK, "zombie", c, {}).worker == "b"  # type: ignore[union-attr]
    assert reassign(TASK, "a", c, {}).worker == "b"  # type: ignore[union-attr]


def test_a_worker_busy_loading_another_model_is_no_quicker_home() -> None:
    # b is idle but its loader is taken by a 4,000 ms load of y (just begun): a move there
    # loads x (2,000 ms) only after it, 6,100 ms in all, later than a's 5,100
    c = ClusterView.of([
        worker("a", backlog_ms=5000.0, resident=frozenset({"x"})),
        worker("b", gpu_free_mb=10000.0, loading={"y": (0.0, 4.0)}),
    ], {**MODELS, "y": 6000.0})
    assert reassign(TASK, "a", c, {}) is None
    idle = ClusterView.of([worker("a", backlog_ms=5000.0, resident=frozenset({"x"})),
                           worker("b", gpu_free_mb=10000.0)], {**MODELS, "y": 6000.0})
    moved = reassign(TASK, "a", idle, {})  # without the load under way it would move
    assert moved is not None and moved.worker == "b" and moved.finish_ms == 2100.0
