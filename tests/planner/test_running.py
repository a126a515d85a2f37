"""Tasks in flight count only for what is left of them: a worker whose running task is
half done has half its charge ahead, in the numpy path, the scalar reference, the plan,
admission and successor re-placement alike."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass_celery.planner import ClusterView, DagSpec, TaskSpec, get_policy
from compass_celery.planner.adjust import choose_successor
from compass_celery.planner.admission import Slo, job_finish_ms, judge
from compass_celery.planner.cost import (
    backlog_left_ms,
    build_worker_arrays,
    ran_ms,
    run_rate,
    settled,
    with_rows,
    worker_arrays,
)
from compass_celery.planner.walk import Walk

from .strategies import clusters, worker

# 800 ms running since t=10 s, due to end at 10.8 s, and 200 ms queued behind it
BUSY = worker("a", backlog_ms=1000.0, running=((10.0, 10.8, 800.0),))
IDLE_ISH = worker("b", backlog_ms=650.0)
TASK = TaskSpec("t", None, 100.0)


def test_a_task_half_done_has_half_its_charge_ahead() -> None:
    assert backlog_left_ms(BUSY, 10.4) == pytest.approx(600.0)  # 400 left + 200 queued
    assert backlog_left_ms(BUSY, 10.0) == 1000.0  # just started: all of it
    assert backlog_left_ms(BUSY, 9.0) == 1000.0  # a reader's clock behind: clipped
    assert backlog_left_ms(BUSY, 11.5) == pytest.approx(200.0)  # overran: about to end
    cluster = ClusterView.of([BUSY, IDLE_ISH], {}, now=10.4)
    assert worker_arrays(cluster).backlog_left_ms(10.4).tolist() == pytest.approx([600, 650])
    placed = get_policy("compass").plan(DagSpec.single(TASK), cluster).placements["t"]
    # the half-done worker is the sooner one; counted whole (1,000 ms) it would lose
    assert placed.worker == "a" and placed.start_ms == pytest.approx(600.0)
    # admission judges the same prediction: 700 ms fits a 800 ms deadline
    assert judge(Slo("click", 800.0), job_finish_ms({"t": placed})).admitted
    whole = ClusterView.of([BUSY, IDLE_ISH], {}, now=10.0)
    assert get_policy("compass").plan(DagSpec.single(TASK), whole).worker_of("t") == "b"


def test_a_successor_stays_on_a_worker_whose_running_task_is_nearly_done() -> None:
    # 1,000 ms of backlog is over 1.5x a 100 ms run: moved, unless most of it has run
    keep = choose_successor(TASK, "a", lambda: ClusterView.of([BUSY, IDLE_ISH], {}, now=10.79),
                            {}, factor=1.5, is_join=False, adjusts=True,
                            planned=replace(BUSY, backlog_ms=810.0), now=10.79)
    assert keep is None
    moved = choose_successor(TASK, "a", lambda: ClusterView.of([BUSY, IDLE_ISH], {}, now=10.0),
                             {}, factor=1.5, is_join=False, adjusts=True,
                             planned=replace(BUSY, backlog_ms=810.0), now=10.0)
    assert moved is not None and moved.worker == "b"


def test_a_finished_task_is_taken_off_once() -> None:
    done = settled(BUSY, 800.0)  # its end, before the record says so
    assert done.backlog_ms == 200.0 and done.running == ()
    assert backlog_left_ms(done, 10.8) == 200.0  # not 200 - 800 (clipped to 0)


def test_the_rule_is_elementwise_and_clipped() -> None:
    began, ends, charge = np.array([0.0, 0.0, 5.0]), np.array([2.0, 0.0, 7.0]), np.full(3, 10.0)
    rate = run_rate(began, ends, charge)  # an empty span has run all of it once begun
    assert ran_ms(began, rate, charge, 1.0).tolist() == [5.0, 10.0, 0.0]
    assert float(ran_ms(0.0, float(run_rate(0.0, 2.0, 10.0)), 10.0, 1.0)) == 5.0


@settings(max_examples=60, deadline=None)
@given(cluster=clusters(), now=st.floats(0.0, 1000.0))
def test_numpy_backlog_left_equals_scalar_reference(cluster: ClusterView, now: float) -> None:
    arr = worker_arrays(cluster)
    got = arr.backlog_left_ms(now)
    want = [backlog_left_ms(w, now) for w in cluster.workers]
    assert got.tolist() == pytest.approx(want, abs=1e-9)
    walk = Walk(DagSpec.single(TASK), cluster)  # a plan starts from them, at its snapshot
    ref = [backlog_left_ms(w, cluster.now) + w.pending_ms for w in cluster.workers]
    assert walk.avail.tolist() == pytest.approx(ref, abs=1e-9)


def test_a_charge_keeps_the_running_rates_and_a_new_task_does_not() -> None:
    """with_rows carries the running tasks' rates over while what runs is the same: a
    producer's own charge (backlog only) reads the same left backlog as a full build;
    a row whose running task changed has its rates worked out again."""
    cluster = ClusterView((BUSY, IDLE_ISH), {})
    arrays = worker_arrays(cluster)
    arrays.backlog_left_ms(10.4)  # works out and memoises the rates
    charged = replace(BUSY, backlog_ms=1300.0)
    got = with_rows(arrays, {0: charged}, {0: BUSY})
    assert got._left.get(None) is arrays._left.get(None) is not None
    full = build_worker_arrays(replace(cluster, workers=(charged, IDLE_ISH)))
    assert got.backlog_left_ms(10.4).tolist() == full.backlog_left_ms(10.4).tolist()
    assert got.backlog_left_ms(10.4).tolist() == pytest.approx([900.0, 650.0])
    moved = replace(BUSY, running=((10.2, 10.4, 200.0),))  # another task, half its rate
    again = with_rows(arrays, {0: moved}, {0: BUSY})
    assert None not in again._left
    assert again.backlog_left_ms(10.3).tolist() == pytest.approx([900.0, 650.0])
