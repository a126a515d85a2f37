"""The admission rules, pure: what is admitted, late, refused, and when work is shed."""

from __future__ import annotations

import math

import pytest

from compass_celery.planner.admission import (
    DEFAULT_SLO_CLASSES,
    ERROR_CAP_SHARE,
    REFUSAL_CAUSES,
    Slo,
    SloError,
    error_step_ms,
    job_finish_ms,
    job_wait_ms,
    judge,
    latest_start,
    plan_error_step,
    resolve_slo,
    retry_after_s,
    should_shed,
    tails_ms,
)
from compass_celery.planner.types import SHARED, Placement

STRICT = Slo("interactive", 400.0, "reject", 9)


def test_a_job_that_meets_its_deadline_is_admitted():
    v = judge(STRICT, 350.0, 100.0)
    assert v.admitted and not v.late and v.miss_ms == 0


def test_a_predicted_miss_is_refused_with_how_much_and_when():
    v = judge(STRICT, 1000.0, 700.0)
    assert not v.admitted and v.miss_ms == 600.0 and v.retry_after_ms == 600.0
    assert "600 ms past its 400 ms deadline" in v.reason
    assert retry_after_s(v, time_scale=0.5) == pytest.approx(0.3)


def test_late_class_and_admission_off_take_the_job_marked_late():
    late = judge(Slo("report", 400.0, "late"), 1000.0)
    off = judge(STRICT, 1000.0, admission=False)
    assert late.admitted and late.late and off.admitted and off.late


def test_no_deadline_or_no_prediction_admits():
    assert judge(None, 10_000.0).admitted
    assert judge(STRICT, math.nan).admitted  # no live worker: nothing says it will miss


def test_the_queue_bound_counts_time_not_messages_and_applies_without_a_deadline():
    v = judge(None, 5000.0, 3000.0, max_queue_ms=2000.0)
    assert not v.admitted and v.retry_after_ms == 1000.0 and "queue full" in v.reason
    assert judge(None, 1500.0, 1000.0, max_queue_ms=2000.0).admitted
    assert judge(None, 5000.0, 3000.0, max_queue_ms=2000.0, admission=False).admitted


def test_classes_resolve_with_explicit_values_winning():
    assert resolve_slo(None, None, {}) is None
    s = resolve_slo("interactive", None, {})
    assert s.deadline_ms == DEFAULT_SLO_CLASSES["interactive"]["deadline_ms"] and s.sheds
    s = resolve_slo("interactive", 900, {}, on_miss="late")
    assert s.deadline_ms == 900 and s.on_miss == "late" and not s.sheds
    s = resolve_slo("gold", None, {"gold": {"deadline_ms": 150, "priority": 8}})
    assert (s.name, s.deadline_ms, s.priority) == ("gold", 150, 8)
    assert not resolve_slo("batch", None, {}).sheds  # no deadline: nothing to shed


@pytest.mark.parametrize(("args", "message"), [
    (("nope", None, {}), "unknown SLO class 'nope'"),
    ((None, -5, {}), "deadline_ms must be a number of milliseconds > 0"),
    ((None, 400, {}, "drop"), "on_miss must be one of reject, late, degrade"),
    (("x", None, {"x": {"deadline": 3}}), "unknown fields ['deadline']"),
])
def test_bad_slos_name_the_problem(args, message):
    with pytest.raises(SloError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resolve_slo(*args)


def _p(worker: str, start: float, finish: float) -> Placement:
    return Placement("t", worker, f"q.{worker}", start, finish, wait_ms=start)


def test_tails_and_latest_starts_follow_the_plan():
    plan = {"a": _p("w1", 100.0, 200.0), "b": _p("w2", 250.0, 400.0)}
    assert job_finish_ms(plan) == 400.0 and job_wait_ms(plan) == 100.0
    assert tails_ms(plan) == {"a": 300.0, "b": 150.0}
    due = 1000.0
    assert latest_start(due, 150.0, time_scale=1.0) == pytest.approx(999.85)
    assert not should_shed(999.8, due, 150.0) and should_shed(999.9, due, 150.0)
    assert not should_shed(999.9, None, 150.0)
    # a plan on the shared queue predicts nothing
    assert math.isnan(job_finish_ms({"a": _p(SHARED, 0.0, 0.0)})) and tails_ms({}) == {}


def test_a_miss_caused_only_by_model_loads_is_taken_late_and_not_shed():
    """A deadline shorter than a load must not refuse every job needing the model for
    good: the job that would load it is taken (late) and run to the end."""
    cold = judge(STRICT, 700.0, 0.0, load_ms=633.0)
    assert cold.admitted and cold.late and cold.kind == "cold" and not cold.sheds
    assert "taken late, so that they load" in cold.reason
    # a miss from queued work is still refused, loads or not
    busy = judge(STRICT, 1400.0, 700.0, load_ms=633.0)
    assert not busy.admitted and busy.kind == "deadline"
    assert judge(STRICT, 300.0).sheds  # on time: it may be shed if it falls behind


def test_a_refusal_names_its_cause_as_refusals_are_counted():
    assert judge(STRICT, 900.0, 500.0).cause == "deadline"  # queued work ahead
    # on time but for the model it loads, with no idle worker to load it late
    assert judge(STRICT, 700.0, 300.0, load_ms=500.0).cause == "cold"
    # its loads alone do not explain the miss: a deadline refusal, loads or not
    assert judge(STRICT, 1400.0, 700.0, load_ms=633.0).cause == "deadline"
    assert judge(STRICT, 100.0, 9000.0, max_queue_ms=5000.0).cause == "queue_full"
    assert judge(None, 100.0, 9000.0, max_queue_ms=5000.0).cause == "queue_full"
    assert judge(STRICT, 100.0).cause == "" and judge(STRICT, 700.0, 0.0, load_ms=633.0).cause == ""
    assert set(REFUSAL_CAUSES) == {"deadline", "queue_full", "cold"}


def test_headroom_keeps_a_share_of_the_deadline_for_the_plans_error():
    assert judge(STRICT, 350.0).admitted
    tight = judge(STRICT, 350.0, headroom=0.2)  # must finish within 320 ms
    assert not tight.admitted and tight.miss_ms == pytest.approx(30.0)
    assert "less 20% headroom" in tight.reason


def test_the_learned_plan_error_is_added_to_the_prediction():
    assert judge(STRICT, 300.0, headroom=0.1).admitted  # 300 <= 360
    late = judge(STRICT, 300.0, headroom=0.1, error_ms=80.0)
    assert not late.admitted and late.predicted_ms == 380.0
    assert judge(STRICT, 300.0, headroom=0.1, error_ms=-50.0).admitted  # never a bonus


def test_the_plan_error_charged_is_capped_so_a_class_is_never_locked_out():
    # STRICT: 400 ms. An error learned past the deadline charges at most half of it:
    # a short plan is still taken, a long one refused
    assert ERROR_CAP_SHARE == 0.5
    short = judge(STRICT, 100.0, headroom=0.1, error_ms=5000.0)
    assert short.admitted and short.predicted_ms == 300.0
    assert not judge(STRICT, 200.0, headroom=0.1, error_ms=5000.0).admitted  # 400 > 360


def test_the_plan_error_quantile_settles_where_tau_of_the_errors_are_within_it():
    import random

    rng = random.Random(1)
    q = 0.0
    errors = [rng.gauss(40.0, 20.0) for _ in range(20_000)]
    for e in errors:
        q = plan_error_step(q, e)
    within = sum(e <= q for e in errors[-5000:]) / 5000
    assert 0.93 <= within <= 0.97, (q, within)


def test_the_plan_error_steps_by_a_share_of_the_deadline():
    """A 400 ms class steps 4 ms, a 1,500 ms one 7.5 ms: a 1,500 ms class whose plans run
    450 ms late learns it in about 64 late jobs, not 120; no deadline or a short one: 4 ms."""
    assert error_step_ms(400) == error_step_ms(800) == 4.0 and error_step_ms(1500) == 7.5
    assert error_step_ms(None) == error_step_ms(100) == 4.0
    q, n = 0.0, 0
    while q < 450.0:
        q, n = plan_error_step(q, 500.0, step_ms=error_step_ms(1500)), n + 1
    assert n <= 64


def test_a_load_only_miss_is_cold_only_on_a_worker_that_would_start_at_once():
    """Loading onto an idle worker adds capacity (take it late); a load behind a queue
    is a lack of capacity (refuse)."""
    idle = judge(STRICT, 500.0, wait_ms=10.0, load_ms=300.0, headroom=0.1)
    assert idle.admitted and idle.kind == "cold"
    queued = judge(STRICT, 500.0, wait_ms=100.0, load_ms=300.0, headroom=0.1)
    assert not queued.admitted and queued.kind == "deadline"


def test_only_a_job_taken_as_on_time_is_shed_when_it_falls_behind():
    assert judge(STRICT, 300.0).sheds
    assert not judge(STRICT, 900.0, admission=False).sheds  # taken late: runs to the end
    assert not judge(Slo("report", 400.0, "late"), 900.0).sheds


def test_a_guessed_run_time_is_taken_late_on_an_idle_worker_and_refused_behind_a_queue():
    idle = judge(STRICT, 500.0, 0.0, guessed=True)
    assert idle.admitted and idle.late and idle.kind == "unlearned"
    assert "none measured yet" in idle.reason
    assert not judge(STRICT, 500.0, 0.0).admitted  # the same plan, on a known run time
    busy = judge(STRICT, 500.0, 300.0, guessed=True)  # a queue ahead: lack of capacity
    assert not busy.admitted and busy.kind == "deadline"
