"""A worker about to be free with batch work waiting, as an urgent plan prices it, pure.

Traced at 8 jobs/s on navigator-mixed (docs/results/race): a level-9 step planned on a
worker whose snapshot showed it free (between two tasks, or its task about to end) with
batch work queued waited a whole batch run, because the worker took its next batch task
in the milliseconds before the step landed in its queue. ``planner.priority.race_ms``
charges such a worker one lower-level task, unless its held slot holds that work."""

from __future__ import annotations

import pytest

from compass_celery.planner import get_policy
from compass_celery.planner.priority import RACE_MARGIN_MS, for_priority, race_clock, race_ms
from compass_celery.planner.types import ClusterView, DagSpec, TaskSpec, WorkerView

NOW = 100.0  # the snapshot's clock (s)
BATCH_MS = 400.0  # what a batch task runs


def _w(name: str, *, left_ms: float | None, queued: dict[int, float],
       planned: dict[int, float] | None = None, hop_ms: float = 5.0) -> WorkerView:
    """A worker with the model resident, running a batch task with ``left_ms`` to go
    (None: between tasks, nothing running), and ``queued`` waiting per level."""
    running = () if left_ms is None else (
        (NOW - (BATCH_MS - left_ms) / 1000, NOW + left_ms / 1000, BATCH_MS),)
    run = 0.0 if left_ms is None else BATCH_MS
    planned = planned or {}
    return WorkerView(name=name, queue=f"q.{name}", gpu_total_mb=1000, gpu_free_mb=500,
                      resident=frozenset({"m"}), backlog_ms=run + sum(queued.values()),
                      queued_ms=queued, running=running, hop_ms=hop_ms,
                      pending_ms=sum(planned.values()), pending_queued_ms=planned)


def test_a_worker_between_tasks_with_batch_waiting_is_charged_a_batch_task() -> None:
    gap = _w("gap", left_ms=None, queued={0: 3000.0})
    busy = _w("busy", left_ms=250.0, queued={0: 3000.0})
    # the next batch task it may start: the mean running charge, at most what waits
    assert race_ms(gap, 9, NOW, BATCH_MS) == BATCH_MS
    assert race_ms(_w("g", left_ms=None, queued={0: 100.0}), 9, NOW, BATCH_MS) == 100.0
    assert race_ms(busy, 9, NOW, BATCH_MS) == 0.0  # its push lands before the task ends
    seen = {w.name: w.backlog_ms for w in for_priority([gap, busy], 9, NOW)}
    assert seen == {"gap": BATCH_MS, "busy": BATCH_MS}  # busy: its own run, 250 ms left
    # without the clock (the simulator, which has no race): as before
    assert {w.name: w.backlog_ms for w in for_priority([gap, busy], 9)} == {
        "gap": 0.0, "busy": BATCH_MS}


def test_the_window_is_the_workers_gap_and_the_margin() -> None:
    near = _w("near", left_ms=RACE_MARGIN_MS + 4.0, queued={0: 3000.0}, hop_ms=5.0)
    far = _w("far", left_ms=RACE_MARGIN_MS + 6.0, queued={0: 3000.0}, hop_ms=5.0)
    assert race_ms(near, 9, NOW, BATCH_MS) == BATCH_MS
    assert race_ms(far, 9, NOW, BATCH_MS) == 0.0


def test_what_the_held_slot_holds_is_not_charged() -> None:
    # a level-9 successor planned on it: its fetch takes nothing below 9 (worker.core)
    held = _w("held", left_ms=None, queued={0: 3000.0}, planned={9: 50.0})
    assert race_ms(held, 9, NOW, BATCH_MS) == 0.0
    # held below 5 only: the level-6 task waiting is not held, and is charged
    part = _w("part", left_ms=None, queued={0: 3000.0, 6: 80.0}, planned={5: 50.0})
    assert race_ms(part, 9, NOW, BATCH_MS) == 80.0
    # nothing waits below the level: nothing to start first
    assert race_ms(_w("top", left_ms=None, queued={9: 30.0}), 9, NOW, BATCH_MS) == 0.0


def test_the_sender_is_not_charged() -> None:
    """The worker releasing a successor pushes it before its own next pick."""
    gap = _w("gap", left_ms=None, queued={0: 3000.0})
    seen, = for_priority([gap], 9, NOW, sender="gap")
    assert seen.backlog_ms == 0.0


def test_an_urgent_step_goes_where_its_deadline_holds() -> None:
    """The gap worker looks free (finish 50 ms), the busy one frees in 250 ms: the plan
    puts the step on the busy one, not where a batch task may start first (450 ms)."""
    gap = _w("gap", left_ms=None, queued={0: 3000.0})
    busy = _w("busy", left_ms=250.0, queued={0: 3000.0})
    dag = DagSpec({"a": TaskSpec("a", "m", 50.0)}, (), "click")
    policy = get_policy("compass")
    naive = policy.plan(dag, ClusterView.of(for_priority([gap, busy], 9), {"m": 100.0}, NOW))
    priced = policy.plan(dag, ClusterView.of(for_priority([gap, busy], 9, NOW),
                                             {"m": 100.0}, NOW))
    assert naive.placements["a"].worker == "gap"
    assert priced.placements["a"].worker == "busy"
    assert priced.placements["a"].finish_ms == pytest.approx(250.0 + 50.0 + 5.0, abs=1.0)


def test_the_race_is_priced_only_where_the_workers_hold() -> None:
    """With the held slot off the charge was not shown to help (docs/results/race): the
    plan then prices no race, and plans as before."""
    assert race_clock(NOW, 1000.0) == NOW
    assert race_clock(NOW, 0.0) is None
    gap = _w("gap", left_ms=None, queued={0: 3000.0})
    busy = _w("busy", left_ms=250.0, queued={0: 3000.0})  # what runs: a batch task's charge
    assert for_priority((gap, busy), 9, race_clock(NOW, 0.0))[0].backlog_ms == 0.0
    assert for_priority((gap, busy), 9, race_clock(NOW, 1000.0))[0].backlog_ms == BATCH_MS
