"""The batch cost model and the placement rule: join a forming batch when that finishes
first, take the idle worker when it does."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from compass_celery.planner import ClusterView, CompassPolicy, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.batch import (
    BatchCurve,
    BatchError,
    BatchSpec,
    CurveLearner,
    Forming,
    batch_key,
    batch_spec,
    forming_from_count,
    hold_until_ms,
    join_finish_ms,
    marginal_ms,
)
from compass_celery.planner.walk import Walk

CURVE = BatchCurve(20.0, 2.0)
SPEC = BatchSpec(8, 5.0, CURVE)
EMBED = TaskSpec("embed", "m", 20.0, batch=SPEC)
KEY = batch_key("embed", "m")


def view(name: str, backlog: float = 0.0, forming: dict[str, Forming] | None = None,
         speed: float = 1.0) -> WorkerView:
    """A 16 GB worker with model ``m`` resident."""
    return WorkerView(name, name, 16000.0, 15000.0, frozenset({"m"}), backlog_ms=backlog,
                      speed=speed, forming=forming or {})


def plan(task: TaskSpec, *workers: WorkerView):  # type: ignore[no-untyped-def]
    cluster = ClusterView.of(workers, {"m": 1000.0})
    return CompassPolicy().plan(DagSpec.single(task), cluster).placements[task.name]


# -- the curve ------------------------------------------------------------------------

def test_curve_is_base_plus_per_item_for_each_extra_input() -> None:
    assert CURVE.of(1) == 20.0 and CURVE.of(8) == 34.0
    assert CURVE.per_input_ms(8) == pytest.approx(34.0 / 8)
    assert marginal_ms(CURVE, 0) == 20.0 and marginal_ms(CURVE, 3) == 2.0
    with pytest.raises(BatchError):
        CURVE.of(0)


def test_curve_from_a_single_run_and_a_declared_speedup() -> None:
    # MiniLM, this project's measurement: 11.7 ms alone, 32 in 32 x 2.97 ms (speed-up 3.94)
    c = BatchCurve.from_speedup(11.7, 11.7 / 2.97, 32)
    assert c.base_ms == 11.7 and c.of(32) == pytest.approx(32 * 2.97)
    assert BatchCurve.from_speedup(10.0, 1.0, 1) == BatchCurve(10.0, 10.0)
    with pytest.raises(BatchError, match="speedup"):
        BatchCurve.from_speedup(10.0, 40.0, 32)


def test_fit_recovers_a_line_and_is_least_squares() -> None:
    c = BatchCurve.fit([(1, 20.0), (4, 26.0), (16, 50.0)])
    assert c.base_ms == pytest.approx(20.0) and c.per_item_ms == pytest.approx(2.0)
    noisy = BatchCurve.fit([(1, 21.0), (1, 19.0), (9, 37.0), (9, 35.0)])
    assert noisy.base_ms == pytest.approx(20.0) and noisy.per_item_ms == pytest.approx(2.0)


def test_fit_with_a_single_size_claims_no_gain() -> None:
    assert BatchCurve.fit([(1, 12.0), (1, 14.0)]) == BatchCurve(13.0, 13.0)
    c = BatchCurve.fit([(4, 40.0)])  # ms per input of the only size seen
    assert c.base_ms == c.per_item_ms == 10.0


def test_a_learner_finds_the_curve_of_the_passes_it_is_shown() -> None:
    learner = CurveLearner()
    assert learner.curve() is None
    learner.add(1, 100.0)
    assert learner.curve() == BatchCurve(100.0, 100.0)  # one size: no gain claimed yet
    for size in (1, 6, 3, 8, 2, 5) * 20:
        for _ in range(size):  # each input of a pass reports it with a share of weight
            learner.add(size, 100.0 + 20.0 * (size - 1), 1.0 / size)
    c = learner.curve()
    assert c is not None
    assert c.base_ms == pytest.approx(100.0) and c.per_item_ms == pytest.approx(20.0)


def test_a_learners_curve_is_taken_once_per_whole_pass() -> None:
    """Each input of a pass reports it with a share of its weight; the curve is taken
    (stored by the worker) when the last share is in, not once per input."""
    learner = CurveLearner()
    taken = []
    for size in (4, 2, 3):
        for _ in range(size):
            learner.add(size, 100.0 + 20.0 * (size - 1), 1.0 / size)
            taken.append(learner.take() is not None)
    assert taken == [False, False, False, True, False, True, False, False, True]
    learner.add(5, 180.0, 0.2)  # an input of a pass whose others failed: carried over
    assert learner.take() is None and learner.curve() is not None


def test_a_learner_follows_a_model_that_got_faster_and_ignores_bad_samples() -> None:
    learner = CurveLearner()
    for size in (1, 4, 8) * 30:
        learner.add(size, 50.0 + 10.0 * (size - 1))
    for size in (1, 4, 8) * 60:
        learner.add(size, 20.0 + 2.0 * (size - 1))
    for bad in ((0, 5.0), (2, math.nan), (2, -1.0)):
        learner.add(*bad)
    learner.add(3, 1e6, weight=0.0)
    c = learner.curve()
    assert c is not None
    assert c.base_ms == pytest.approx(20.0, rel=0.05)
    assert c.per_item_ms == pytest.approx(2.0, rel=0.1)


def test_fit_clips_noise_below_zero_and_rejects_bad_samples() -> None:
    assert BatchCurve.fit([(1, 30.0), (8, 20.0)]).per_item_ms == 0.0
    with pytest.raises(BatchError):
        BatchCurve.fit([])
    with pytest.raises(BatchError):
        BatchCurve.fit([(0, 10.0)])
    with pytest.raises(BatchError):
        BatchCurve.fit([(2, math.nan)])


@pytest.mark.parametrize(("kw", "field"), [
    ({"max_size": 0}, "max_size"), ({"max_size": 2.5}, "max_size"),
    ({"max_size": True}, "max_size"), ({"max_size": 4, "max_wait_ms": -1}, "max_wait_ms"),
    ({"max_size": 4, "max_wait_ms": math.inf}, "max_wait_ms"),
])
def test_spec_errors_name_the_field(kw: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(BatchError, match=f"batch.{field}"):
        BatchSpec(**kw)


def test_curve_errors_name_the_field() -> None:
    with pytest.raises(BatchError, match="batch.per_item_ms"):
        BatchCurve(10.0, -1.0)
    with pytest.raises(BatchError, match="batch.base_ms"):
        BatchCurve(math.nan, 1.0)


def test_batch_spec_from_an_option() -> None:
    s = batch_spec({"max_size": 32, "max_wait_ms": 5, "per_item_ms": 3}, exec_ms=12.0)
    assert s == BatchSpec(32, 5.0, BatchCurve(12.0, 3.0))
    assert batch_spec({"max_size": 4}).curve is None
    assert batch_spec({"max_size": 4}).curve_for(9.0) == BatchCurve(9.0, 9.0)
    with pytest.raises(BatchError, match="unknown fields"):
        batch_spec({"max_size": 4, "size": 2})
    with pytest.raises(BatchError, match="batch.max_size: missing"):
        batch_spec({"max_wait_ms": 4})
    with pytest.raises(BatchError, match="batch.base_ms"):
        batch_spec({"max_size": 4, "per_item_ms": 1.0})  # no exec_ms to default to


# -- joining a forming batch ----------------------------------------------------------

def test_join_finish_starts_with_the_batch_and_adds_one_input() -> None:
    f = Forming(3, 10.0)
    assert join_finish_ms(f, SPEC, CURVE, ready_ms=0.0, load_ms=0.0, speed=1.0) == 10 + 26
    assert join_finish_ms(f, SPEC, CURVE, ready_ms=0.0, load_ms=0.0, speed=2.0) == 10 + 13
    assert join_finish_ms(None, SPEC, CURVE, ready_ms=0.0, load_ms=0.0, speed=1.0) is None
    full = Forming(8, 10.0)
    assert join_finish_ms(full, SPEC, CURVE, ready_ms=0.0, load_ms=0.0, speed=1.0) is None
    # inputs ready only after the batch has started: too late to join it
    assert join_finish_ms(f, SPEC, CURVE, ready_ms=11.0, load_ms=0.0, speed=1.0) is None


def test_joins_a_forming_batch_when_that_finishes_first() -> None:
    # w0: a batch of 3 forming at once (26 ms with this task); w1 busy for 30 ms more
    p = plan(EMBED, view("w0", CURVE.of(3), {KEY: Forming(3, 0.0)}), view("w1", 30.0))
    assert p.worker == "w0" and p.start_ms == 0.0 and p.finish_ms == CURVE.of(4)
    assert "joins a forming batch (4 inputs)" in p.reason


def test_picks_the_idle_worker_when_it_finishes_earlier() -> None:
    # joining finishes at 26 ms; an idle worker runs it alone in 20 ms
    p = plan(EMBED, view("w0", CURVE.of(3), {KEY: Forming(3, 0.0)}), view("w1"))
    assert p.worker == "w1" and p.finish_ms == 20.0 and "joins" not in p.reason


def test_joins_a_batch_queued_behind_work_when_that_still_wins() -> None:
    # w0: 10 ms of other work, then a batch of 2 (24 ms); w1 busy 25 ms: 10+26 < 25+20
    p = plan(EMBED, view("w0", 10 + CURVE.of(2), {KEY: Forming(2, 10.0)}), view("w1", 25.0))
    assert p.worker == "w0" and p.start_ms == 10.0 and p.finish_ms == 10 + CURVE.of(3)


def test_a_full_batch_or_another_key_is_not_joined() -> None:
    full = view("w0", CURVE.of(8), {KEY: Forming(8, 0.0)})
    p = plan(EMBED, full, view("w1", 40.0))
    # full: a new batch after it, 34 + 20 (joining would have been 0 + 36)
    assert p.worker == "w0" and p.finish_ms == 54.0 and "joins" not in p.reason
    other = view("w0", CURVE.of(3), {batch_key("embed", "n"): Forming(3, 0.0)})
    assert plan(EMBED, other, view("w1", 40.0)).finish_ms == CURVE.of(3) + 20.0


def test_speed_scales_the_batch_pass() -> None:
    p = plan(EMBED, view("w0", 13.0, {KEY: Forming(3, 0.0)}, speed=2.0), view("w1", 15.0))
    assert p.worker == "w0" and p.finish_ms == CURVE.of(4) / 2


def test_commit_adds_only_the_marginal_cost_and_grows_the_batch() -> None:
    dag = DagSpec({"embed": EMBED, "other": TaskSpec("other", "m", 20.0)})
    cluster = ClusterView.of([view("w0", CURVE.of(3), {KEY: Forming(3, 0.0)})], {"m": 1000.0})
    walk = Walk(dag, cluster)
    est = walk.estimate("embed")
    assert est.joins == {0: 2.0}
    walk.commit("embed", 0, est, "x")
    assert walk.avail[0] == CURVE.of(3) + 2.0
    assert walk.forming(EMBED)[0] == Forming(4, 0.0)
    other = walk.estimate("other")  # everything queued after the batch moved back 2 ms
    assert other.joins is None and other.finish[0] == CURVE.of(4) + 20.0


def test_a_new_batch_forms_where_a_batchable_task_is_placed_alone() -> None:
    cluster = ClusterView.of([view("w0", 7.0)], {"m": 1000.0})
    walk = Walk(DagSpec.single(EMBED), cluster)
    est = walk.estimate("embed")
    walk.commit("embed", 0, est, "x")
    assert walk.forming(EMBED) == {0: Forming(1, 7.0)} and walk.avail[0] == 27.0


def test_use_batch_off_ignores_forming_batches() -> None:
    cluster = ClusterView.of([view("w0", CURVE.of(3), {KEY: Forming(3, 0.0)})], {"m": 1000.0})
    est = Walk(DagSpec.single(EMBED), cluster, use_batch=False).estimate("embed")
    assert est.joins is None and est.finish[0] == CURVE.of(3) + 20.0


def test_defaults_change_nothing() -> None:
    """No batch on the task: forming batches are never looked at; no forming published:
    a batchable task is costed as before."""
    plain = TaskSpec("embed", "m", 20.0)
    workers = (view("w0", 30.0), view("w1", 25.0))
    with_forming = (view("w0", 30.0, {KEY: Forming(3, 0.0)}), view("w1", 25.0))
    a, b = plan(plain, *workers), plan(plain, *with_forming)
    assert a == b and a.worker == "w1" and a.finish_ms == 45.0
    assert plan(EMBED, *workers) == a
    assert WorkerView("w", "w", 1.0, 1.0).forming == {} and plain.batch is None


# -- holding a batch open ---------------------------------------------------------------

def test_hold_rules() -> None:
    start = -math.inf
    assert hold_until_ms(0.0, SPEC, waiting=1, others_ready=False) == start  # alone: go
    assert hold_until_ms(0.0, SPEC, waiting=8, others_ready=False) == start  # full: go
    assert hold_until_ms(0.0, SPEC, waiting=3, others_ready=True) == start  # work behind
    assert hold_until_ms(0.0, BatchSpec(8, 0.0), waiting=3, others_ready=False) == start
    assert hold_until_ms(2.0, SPEC, waiting=3, others_ready=False) == 7.0
    assert hold_until_ms(2.0, SPEC, waiting=3, others_ready=False, latest_start_ms=4.0) == 4.0


def _counted(name: str, backlog: float, waiting: int) -> WorkerView:
    """A worker as a real one publishes itself: a count of queued inputs, no batch."""
    return replace(view(name, backlog), queued_inputs={"emulated.embed|m": waiting})


KEYED = replace(EMBED, batch=replace(SPEC, key="emulated.embed|m"))


def test_a_count_of_queued_inputs_reads_as_the_open_batch_queued_last() -> None:
    # 10 ms of other work, then 3 inputs (the open batch, 24 ms): it starts at 10
    cluster = ClusterView.of([_counted("w0", 10 + CURVE.of(3), 3)], {"m": 1000.0})
    assert Walk(DagSpec.single(KEYED), cluster).forming(KEYED) == {0: Forming(3, 10.0)}
    # 11 waiting with batches of 8: one full batch ahead, the open one holds 3
    assert forming_from_count(11, SPEC, CURVE, queue_ms=100.0, speed=1.0) == \
        Forming(3, 100.0 - CURVE.of(3))
    assert forming_from_count(8, SPEC, CURVE, queue_ms=100.0, speed=1.0) is None  # full
    assert forming_from_count(0, SPEC, CURVE, queue_ms=100.0, speed=1.0) is None


def test_a_counted_batch_is_joined_and_charged_one_input() -> None:
    p = plan(KEYED, _counted("w0", CURVE.of(3), 3), view("w1", 25.0))
    assert p.worker == "w0" and p.finish_ms == CURVE.of(4) and p.charge_ms == 2.0
    alone = plan(KEYED, view("w0", 0.0), view("w1", 25.0))  # nothing to join: a full run
    assert alone.charge_ms is None and alone.run_ms == 20.0
    # the key is the task's, not the node's: another task's inputs are not joined
    other = plan(EMBED, _counted("w0", CURVE.of(3), 3), view("w1", 40.0))
    assert other.finish_ms == CURVE.of(3) + 20.0 and other.charge_ms is None


def test_a_node_records_batch_survives_the_round_trip_and_garbage_reads_as_unbatched() -> None:
    from compass_celery.planner.batch import batch_from_record, batch_record

    keyed = replace(SPEC, key="j.embed|m")
    assert batch_from_record(batch_record(keyed)) == keyed
    assert batch_record(None) is None and batch_from_record(None) is None
    # a record written before batching, or garbled: placed as an unbatched task
    assert batch_from_record({"max_size": "lots"}) is None
    assert batch_from_record("junk") is None
