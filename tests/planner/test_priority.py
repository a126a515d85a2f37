"""Priority rules, pure: levels and classes, the broker mapping, what a task waits for,
and the ageing rule."""

from __future__ import annotations

import pytest

from compass_celery.needs import TaskNeeds
from compass_celery.placement import decide
from compass_celery.planner import get_policy
from compass_celery.planner.priority import (
    PriorityError,
    aged,
    ahead_ms,
    broker_priority,
    for_priority,
    planned_ahead_ms,
    resolve_priority,
    user_priority,
)
from compass_celery.planner.types import WorkerView
from compass_celery.state.store import Snapshot


def _w(name: str, backlog: float, queued: dict[int, float]) -> WorkerView:
    return WorkerView(name=name, queue=f"compass.w.{name}", gpu_total_mb=1000,
                      gpu_free_mb=500, resident=frozenset({"m"}), backlog_ms=backlog,
                      heartbeat=1.0, queued_ms=queued)


def test_levels_classes_and_the_default() -> None:
    assert resolve_priority(None) == 0  # unset is batch, the lowest, as on RabbitMQ
    assert resolve_priority("interactive") == 9 and resolve_priority("batch") == 0
    assert resolve_priority("urgent", {"urgent": 7}) == 7
    assert resolve_priority("3") == 3 and resolve_priority(9) == 9
    for outside in (42, 10, -1, "12"):  # refused, naming it, not clamped
        with pytest.raises(PriorityError, match=rf"priority {outside!r} is outside 0\.\.9"):
            resolve_priority(outside)
    with pytest.raises(PriorityError, match="unknown priority class 'interactve'"):
        resolve_priority("interactve")


def test_one_direction_on_both_brokers() -> None:
    # kombu's Redis transport serves 0 first: level 9 must become 0 there
    assert broker_priority(9, redis=True) == 0 and broker_priority(0, redis=True) == 9
    assert broker_priority(9, redis=False) == 9
    for level in range(10):
        for redis in (True, False):
            assert user_priority(broker_priority(level, redis), redis) == level


def test_a_task_waits_for_work_in_flight_and_at_its_level_or_above() -> None:
    # 3 s of backlog: 2 s of batch waiting, 0.5 s of urgent waiting, 0.5 s running
    w = _w("a", 3000.0, {0: 2000.0, 9: 500.0})
    assert ahead_ms(w, 0) == 3000.0
    assert ahead_ms(w, 5) == 1000.0
    assert ahead_ms(w, 9) == 1000.0
    same = (w,)
    assert for_priority(same, 0) is same and for_priority(same, None) is same


def test_placement_of_an_urgent_task_skips_the_batch_flood() -> None:
    # a: long batch queue, short in flight; b: no batch but longer urgent work queued
    a = _w("a", 5000.0, {0: 4800.0})
    b = _w("b", 1000.0, {9: 800.0})
    snap = Snapshot(workers=(a, b), taken_at=1.0)
    needs = TaskNeeds("t", "m", 50.0, 0.0, "call")
    policy = get_policy("compass")
    urgent = decide(needs, snap, policy, {"m": 100.0}, "shared", priority=9)
    batch = decide(needs, snap, policy, {"m": 100.0}, "shared", priority=0)
    assert urgent.worker == "a" and urgent.wait_ms == pytest.approx(200.0)
    assert batch.worker == "b"


def test_ageing_climbs_one_level_per_period() -> None:
    assert aged(0, 0.5, 1.0) == 0 and aged(0, 3.2, 1.0) == 3 and aged(0, 99, 1.0) == 9
    assert aged(2, 99, 0.0) == 2  # 0 turns it off


def test_planned_work_below_a_level_is_not_ahead_of_it() -> None:
    """A job's successors planned at batch level (pending, not sent yet) will be overtaken
    once sent, as queued batch work is: an urgent plan does not wait for them."""
    busy = WorkerView(name="busy", queue="q.busy", gpu_total_mb=1000, gpu_free_mb=1000,
                      backlog_ms=100.0, queued_ms={0: 60.0}, pending_ms=5000.0,
                      pending_queued_ms={0: 4800.0, 9: 200.0})
    urgent, = for_priority([busy], 9)
    assert (urgent.backlog_ms, urgent.pending_ms) == (40.0, 200.0)
    assert planned_ahead_ms(busy, 9) == 200.0 and planned_ahead_ms(busy, 0) == 5000.0
    batch, = for_priority([busy], 0)
    assert batch is busy  # the lowest level overtakes nothing
