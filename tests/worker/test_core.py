"""The worker core (``worker.core``) driven directly: no Celery, no Redis, no clock."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from compass_celery.planner import batch as planner_batch
from compass_celery.planner.batch import BatchSpec
from compass_celery.planner.priority import aged
from compass_celery.worker import core
from compass_celery.worker.core import (
    LevelQueue,
    batch_close_at,
    batch_latest_start_ms,
    drop_at_dequeue,
    expires_at_s,
    next_index,
    queued_by_level,
)
from tests.support.blocked import NOTHING_LEAKED, run_blocked

AGE_S = 10.0


@dataclass(eq=False)
class Item:
    name: str
    level: int
    sent_at: float
    charged_ms: float = 10.0
    later: bool = False


def drain(queue: LevelQueue[Item], now_ms: float) -> list[str]:
    return [queue.pop(now_ms).name for _ in range(len(queue))]


def test_the_highest_level_runs_first_then_the_oldest():
    assert next_index([(0, 0.0), (9, 5.0), (5, 1.0)], 10.0, AGE_S) == 1
    assert next_index([(3, 7.0), (3, 2.0), (3, 4.0)], 10.0, AGE_S) == 1
    q: LevelQueue[Item] = LevelQueue(AGE_S)
    for item in (Item("b0", 0, 0.0), Item("i9", 9, 1.0), Item("b1", 0, 2.0),
                 Item("i9b", 9, 3.0), Item("m5", 5, 4.0)):
        q.push(item)
    assert [t.name for t in q] == ["i9", "i9b", "m5", "b0", "b1"]  # the cache's lookahead
    assert drain(q, 5.0) == ["i9", "i9b", "m5", "b0", "b1"]
    assert not q and q.peek(5.0) is None


def test_a_jobs_later_steps_wait_ahead_of_first_steps_at_their_level():
    q: LevelQueue[Item] = LevelQueue(AGE_S)
    for item in (Item("f1", 9, 0.0), Item("b0", 0, 1.0), Item("f2", 9, 2.0),
                 Item("s1", 9, 3.0, later=True), Item("f3", 9, 4.0),
                 Item("s2", 9, 5.0, later=True), Item("bs", 0, 6.0, later=True)):
        q.push(item)
    # later steps first at their level, oldest first; a level below still waits below
    assert [t.name for t in q] == ["s1", "s2", "f1", "f2", "f3", "bs", "b0"]
    assert q.queued_ms() == {9: 50.0, 0: 20.0}
    q.remove(next(t for t in q if t.name == "s1"))  # revoked before it ran
    q.push(Item("s3", 9, 7.0, later=True))  # behind s2, still ahead of the first steps
    taken = q.take(lambda t: t.name in ("s2", "f1"), 2)  # a batch's members
    assert [t.name for t in taken] == ["s2", "f1"]
    q.push(Item("s4", 9, 8.0, later=True))
    assert drain(q, 9.0) == ["s3", "s4", "f2", "f3", "bs", "b0"]
    q.push(Item("s5", 9, 10.0, later=True))  # an emptied level starts over
    q.push(Item("f4", 9, 11.0))
    q.push(Item("s6", 9, 12.0, later=True))
    assert drain(q, 13.0) == ["s5", "s6", "f4"]


def test_ties_are_broken_the_same_way_every_time():
    # same aged level, same age: the one listed first (the higher level it was sent at)
    assert next_index([(2, 0.0), (2, 0.0)], 0.0, AGE_S) == 0
    # a level-1 task aged to 2 against a level-2 task sent just now: the older runs
    assert next_index([(2, 10_000.0), (1, 0.0)], 10_000.0, AGE_S) == 1
    assert next_index([(2, 10_000.0), (1, 1.0)], 10_000.0, AGE_S) == 0  # not aged yet


def test_ageing_lifts_a_starved_low_task():
    q: LevelQueue[Item] = LevelQueue(AGE_S)
    q.push(Item("old batch", 0, 0.0))
    for k in range(5):
        q.push(Item(f"fresh {k}", 9, 89_000.0 + k))
    assert q.peek(1_000.0).name == "fresh 0"  # waited 1 s: still level 0
    assert aged(0, 90.0, AGE_S) == 9  # 90 s waited: nine periods, level 9, and oldest
    assert q.peek(90_000.0).name == "old batch"
    # ageing off: the urgent work keeps the front however long the low task waits
    off: LevelQueue[Item] = LevelQueue(0.0)
    off.push(Item("old batch", 0, 0.0))
    off.push(Item("fresh", 9, 89_000.0))
    assert off.peek(1e9).name == "fresh"


def test_drop_at_dequeue_once_past_the_latest_start():
    latest = expires_at_s(10.0, 400.0)  # due at 10 s, 400 ms of the job still to run
    assert latest == pytest.approx(9.6)
    assert not drop_at_dequeue(9.5, latest)
    assert not drop_at_dequeue(latest, latest)  # exactly at it: still in time
    assert drop_at_dequeue(9.7, latest)
    assert not drop_at_dequeue(1e12, None)  # no deadline: never dropped
    assert expires_at_s(None, 400.0) is None and expires_at_s(10.0, None) is None


def test_queued_charges_per_level():
    assert queued_by_level([(9, 30.0), (0, 50.0), (9, 5.0), (None, 1.0)]) == {9: 35.0, 0: 50.0}
    q: LevelQueue[Item] = LevelQueue(AGE_S)
    items = [Item("a", 0, 0.0, 0.1), Item("b", 9, 0.0, 30.0), Item("c", 0, 1.0, 0.2),
             Item("d", 0, 2.0, 0.7)]
    for item in items:
        q.push(item)
    assert q.queued_ms() == pytest.approx({0: 1.0, 9: 30.0})
    q.remove(items[2])  # from the middle of its level
    assert q.queued_ms() == pytest.approx({0: 0.8, 9: 30.0}) and len(q) == 3
    assert [t.name for t in q.take(lambda t: t.level == 0, 5)] == ["a", "d"]
    assert q.queued_ms() == {9: 30.0}  # an emptied level is gone, not a float residue
    assert q.pop(0.0).name == "b" and q.queued_ms() == {} and len(q) == 0


def test_take_keeps_the_order_of_what_it_leaves():
    q: LevelQueue[Item] = LevelQueue()
    for i, name in enumerate(["x1", "y1", "x2", "y2", "x3"]):
        q.push(Item(name, 0, float(i)))
    assert [t.name for t in q.take(lambda t: t.name[0] == "x", 2)] == ["x1", "x2"]
    assert [t.name for t in q] == ["y1", "y2", "x3"]


def test_batch_hold_is_the_planners_rule():
    assert core.hold_until_ms is planner_batch.hold_until_ms  # delegated, not copied
    spec = BatchSpec(8, max_wait_ms=5.0)
    # forming (3 of 8 wait, nothing else ready): held until 5 ms after the first arrived
    assert batch_close_at(101.0, 100.0, spec, waiting=3, others_ready=False) == 105.0
    assert batch_close_at(105.0, 100.0, spec, waiting=3, others_ready=False) is None
    assert batch_close_at(101.0, 100.0, spec, waiting=3, others_ready=True) is None
    assert batch_close_at(101.0, 100.0, spec, waiting=8, others_ready=False) is None
    assert batch_close_at(101.0, 100.0, spec, waiting=3, others_ready=False,
                          latest_start_ms=103.0) == 103.0  # never past a latest start
    assert batch_latest_start_ms(spec, 10.0, 1.0, 3) == math.inf
    assert batch_latest_start_ms(spec, 10.0, 1.0, 3, due_ms=500.0, tail_ms=40.0) == 460.0
    # a deadline it is not shed at: the deadline less one pass over what waits
    assert batch_latest_start_ms(spec, 10.0, 2.0, 3, due_ms=500.0) == 500.0 - 30.0 / 2.0


def test_the_core_imports_with_celery_kombu_redis_and_torch_blocked():
    out = run_blocked("from compass_celery.worker.core import LevelQueue\n"
                      "LevelQueue(10.0)\n" + NOTHING_LEAKED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


# -- the held slot --------------------------------------------------------------------------
def test_slot_held_while_a_higher_level_is_planned_and_within_the_bound() -> None:
    """A batch task (0) is held while an interactive successor (9) is planned on the
    worker, from the hold's start up to the bound; not below, at or above that level."""
    planned = {9: 560.0, 0: 800.0}
    assert core.slot_held_until(0, planned, 100.0, None, 1000.0) == 1100.0  # begins now
    assert core.slot_held_until(0, planned, 900.0, 100.0, 1000.0) == 1100.0
    assert core.slot_held_until(0, planned, 1100.0, 100.0, 1000.0) is None  # bound passed
    assert core.slot_held_until(9, planned, 100.0, None, 1000.0) is None  # its own level
    assert core.slot_held_until(5, {5: 10.0, 3: 1.0}, 0.0, None, 1000.0) is None
    assert core.slot_held_until(4, {5: 10.0}, 0.0, None, 1000.0) == 1000.0


def test_a_held_slot_ages_the_waiting_task_as_the_queue_does() -> None:
    """A batch task that waited long enough to climb to the planned level is not held
    (ageing: batch is never starved)."""
    planned = {3: 100.0}
    assert core.slot_held_until(0, planned, 25_000.0, None, 1000.0, sent_ms=0.0,
                                age_s=AGE_S) == 26_000.0  # aged to 2: held
    assert core.slot_held_until(0, planned, 30_000.0, None, 1000.0, sent_ms=0.0,
                                age_s=AGE_S) is None  # aged to 3
    assert aged(0, 30.0, AGE_S) == 3


def test_a_held_slot_holds_only_work_without_a_deadline() -> None:
    """A lower-level task whose job has a deadline of its own starts as ever (admission
    priced no hold); one without is held as before, for the same planned level."""
    planned = {9: 560.0}
    assert core.slot_held_until(0, planned, 100.0, None, 1000.0, has_deadline=True) is None
    assert core.slot_held_until(0, planned, 900.0, 100.0, 1000.0, has_deadline=True) is None
    assert core.slot_held_until(0, planned, 100.0, None, 1000.0, has_deadline=False) == 1100.0


def test_slot_not_held_when_off_or_nothing_planned_above() -> None:
    assert core.slot_held_until(0, {9: 560.0}, 0.0, None, 0.0) is None  # off
    assert core.slot_held_until(0, {}, 0.0, None, 1000.0) is None
    assert core.slot_held_until(0, {0: 500.0}, 0.0, None, 1000.0) is None
    # what float sums of charges and releases leave behind is none
    assert core.slot_held_until(0, {9: 1e-12, 8: -3.0}, 0.0, None, 1000.0) is None
    assert core.held_below({9: 1e-12, 6: 30.0, 0: 5.0}) == 6
    assert core.held_below({}) is None
