"""The autoscaling rule: workers needed now and ahead, preload hints, the worker to
drain, damping, and the windowed arrival rate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass_celery.planner.capacity import target_utilisation
from compass_celery.planner.scaling import (
    DEFAULT_HEADROOM,
    ClassLoad,
    Damper,
    Member,
    Need,
    RateWindow,
    choose_removals,
    decide,
    preload_hints,
    workers_needed,
)

SIZES = {"a": 1000.0, "b": 1000.0, "c": 3000.0}


def member(name: str, *resident: str, backlog_ms: float = 0.0, ready: bool = True) -> Member:
    return Member(name, frozenset(resident), backlog_ms, 4000.0, ready=ready)


def test_the_work_term_is_the_classes_work_over_their_utilisation_bound() -> None:
    tight = ClassLoad("i", 10.0, {"a": 100.0}, deadline_ms=400.0, path_ms=100.0)
    loose = ClassLoad("s", 10.0, {"b": 100.0}, deadline_ms=None, path_ms=100.0)
    need = workers_needed([tight, loose], [member("w")], SIZES, max_util=0.8)
    expect = (1.0 / target_utilisation(100.0, 400.0, 0.8) + 1.0 / 0.8) * DEFAULT_HEADROOM
    assert need.work_workers == pytest.approx(expect)
    assert need.now == math.ceil(expect)


def test_a_lower_priority_class_fills_the_room_a_higher_ones_bound_leaves() -> None:
    # interactive at 0.75 (100 ms of a 400 ms deadline), batch capped at 0.8, 2 workers each
    tight = ClassLoad("i", 20.0, {"a": 100.0}, deadline_ms=400.0, path_ms=100.0, priority=9)
    loose = ClassLoad("s", 20.0, {"b": 100.0}, deadline_ms=None, path_ms=100.0)
    level = workers_needed([tight, loose], [member("w")], SIZES, max_util=0.8, headroom=1.0)
    # the batch level waits behind both classes' 4 workers of work at its 0.8 bound; the
    # interactive level behind its own only (2 / 0.75): the larger is needed
    assert level.work_workers == pytest.approx(4.0 / 0.8)
    summed = workers_needed([tight, loose], [member("w")], SIZES, max_util=0.8,
                            headroom=1.0, by_level=False)
    assert summed.work_workers == pytest.approx(2.0 / 0.75 + 2.0 / 0.8)
    assert (level.now, summed.now) == (5, 6)
    # one level (equal priorities): the sum, whatever by_level says
    same = ClassLoad("i", 20.0, {"a": 100.0}, deadline_ms=400.0, path_ms=100.0)
    assert workers_needed([same, loose], [member("w")], SIZES, max_util=0.8,
                          headroom=1.0).work_workers == pytest.approx(summed.work_workers)
    # the higher level binds when its own bound is the tighter need
    heavy = ClassLoad("i", 30.0, {"a": 100.0}, deadline_ms=200.0, path_ms=100.0, priority=9)
    light = ClassLoad("s", 1.0, {"b": 100.0}, deadline_ms=None, path_ms=100.0)
    top = workers_needed([heavy, light], [member("w")], SIZES, max_util=0.8, headroom=1.0)
    assert top.work_workers == pytest.approx(3.0 / target_utilisation(100.0, 200.0, 0.8))


def test_a_rising_rate_asks_for_workers_ahead_and_a_falling_one_keeps_now() -> None:
    rising = ClassLoad("i", 10.0, {"a": 100.0}, path_ms=100.0, trend_per_s2=1.0)
    need = workers_needed([rising], [member("w")], SIZES, horizon_s=30.0)
    assert need.horizon > need.now  # 40 jobs/s in 30 s: four times the work
    falling = ClassLoad("i", 10.0, {"a": 100.0}, path_ms=100.0, trend_per_s2=-1.0)
    need = workers_needed([falling], [member("w")], SIZES, horizon_s=30.0)
    assert need.horizon == need.now


def test_queued_work_asks_for_workers_to_drain_it_over_the_horizon() -> None:
    load = [ClassLoad("i", 1.0, {"a": 10.0}, path_ms=10.0)]
    idle = workers_needed(load, [member("w")], SIZES, horizon_s=10.0)
    behind = workers_needed(load, [member("w", backlog_ms=50_000.0)], SIZES, horizon_s=10.0)
    assert behind.backlog_workers == pytest.approx(5.0)
    assert behind.now >= idle.now + 5


def test_no_load_keeps_the_minimum() -> None:
    assert workers_needed([], [], SIZES, min_workers=2).now == 2
    assert workers_needed([ClassLoad("i", 0.0, {"a": 10.0})], [member("w")], SIZES).now == 1


def test_memory_asks_for_a_worker_per_replica_set_that_fits() -> None:
    # three models of 1, 1 and 3 GB on 4 GB workers, each asked for: two workers' memory
    load = [ClassLoad("i", 1.0, {"a": 1.0, "b": 1.0, "c": 1.0}, path_ms=3.0)]
    need = workers_needed(load, [member("w")], SIZES)
    assert need.by_memory == 2 and need.now == 2


def test_a_new_worker_preloads_the_most_missing_models_that_fit() -> None:
    need = Need(3, 3, targets={"a": 3, "b": 1, "c": 2})
    hints = preload_hints(2, need, [member("w1", "a", "b")], SIZES, 4000.0)
    # a is missing twice, c twice, b never: each new worker gets one copy of each
    assert hints == [("a", "c"), ("a", "c")]
    # workers starting count with their hints: one more copy of each is still missing
    starting = [member("w1", "a", "b"), member("w2", "a", "c", ready=False)]
    assert preload_hints(2, need, starting, SIZES, 4000.0) == [("a", "c"), ()]
    small = preload_hints(1, need, [member("w1", "a", "b")], SIZES, 2500.0)
    assert small == [("a",)]  # c (3 GB) does not fit 2.5 GB after a


def test_the_worker_drained_is_the_one_whose_loss_costs_least() -> None:
    need = Need(2, 2, targets={"a": 1, "b": 2})
    members = [member("w1", "a"), member("w2", "b"), member("w3", "b", backlog_ms=10.0),
               member("w4", ready=False)]
    # w1 holds the only copy of a; w2 and w3 the two copies b needs; w3 has work queued
    assert choose_removals(1, members, need) == ["w2"]
    # a starting worker is never drained, even when asked for more than the ready ones
    # (once w2 is gone, w3 holds b's last copy and its queued work: it goes last)
    assert choose_removals(5, members, need) == ["w2", "w1", "w3"]


def test_a_surplus_copy_costs_nothing_to_drop() -> None:
    need = Need(1, 1, targets={"a": 1})
    members = [member("w1", "a", backlog_ms=5.0), member("w2", "a", backlog_ms=5.0)]
    assert choose_removals(1, members, need) == ["w2"]  # ties go to the last name


def test_the_damper_scales_up_at_once_and_down_after_the_window() -> None:
    damper = Damper(down_window_s=10.0)
    assert damper.step(0.0, 3) == 3
    assert damper.step(1.0, 8) == 8  # up at once
    assert damper.step(2.0, 2) == 8  # a dip inside the window changes nothing
    assert damper.step(10.5, 2) == 8
    assert damper.step(11.5, 2) == 2  # the 8 left the window


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=60), st.floats(0.5, 20.0))
def test_the_damper_never_goes_below_any_recommendation_in_its_window(
        wants: list[int], window: float) -> None:
    damper = Damper(window)
    for t, want in enumerate(wants):
        held = damper.step(float(t), want)
        assert held == max(w for s, w in enumerate(wants[:t + 1]) if s >= t - window)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=8),
       st.integers(0, 6), st.dictionaries(st.sampled_from("abc"), st.integers(1, 4)))
def test_removals_are_ready_distinct_and_as_many_as_asked(
        spec: list[tuple[str, bool]], count: int, targets: dict[str, int]) -> None:
    members = [member(f"w{i}", model, ready=ready) for i, (model, ready) in enumerate(spec)]
    out = choose_removals(count, members, Need(1, 1, targets=targets))
    ready = {m.name for m in members if m.ready}
    assert len(out) == len(set(out)) == min(count, len(ready))
    assert set(out) <= ready


def test_the_rate_window_counts_the_last_window_and_sees_a_clear_rise() -> None:
    window = RateWindow(window_s=10.0, noise_sigma=0.0)
    for i in range(210):  # 2 jobs/s for 5 s, then 40 jobs/s for 5 s
        window.observe("i", 10.0 + i * 0.5 if i < 10 else 15.0 + (i - 10) / 40.0)
    rate, trend = window.rates(20.0)["i"]
    # up fast: the last eighth (1.25 s, 50 arrivals) is far above the window's 21/s
    assert rate == pytest.approx(50 / 1.25)
    assert trend == pytest.approx((200 - 10) / 5.0 / 5.0)
    window.observe("i", 40.0)
    assert window.rates(40.0)["i"] == (pytest.approx(0.1), 0.0)  # old arrivals forgotten


def test_a_rise_within_the_noise_keeps_the_window_rate() -> None:
    window = RateWindow(window_s=10.0, noise_sigma=0.0)
    for i in range(100):  # 2 jobs/s for 5 s, then 18 jobs/s: the last eighth's 22
        window.observe("i", 10.0 + i * 0.5 if i < 10 else 15.0 + (i - 10) / 18.0)
    assert window.rates(20.0)["i"][0] == pytest.approx(10.0)  # 22 < 12.5 + 3 sigma


def test_a_few_arrivals_pass_the_burst_test_by_the_poisson_law_not_its_normal_guess() -> None:
    """A short stretch (the last 5 s of 40) expecting about one arrival: five come 0.6%
    of the time by chance (the normal approximation's 3 sigma, 1.1 + 3.2, called that a
    burst), eight 0.03%: only the latter is one."""
    def window_with(last: int) -> RateWindow:
        window = RateWindow(window_s=40.0, noise_sigma=0.0)
        for t in (22.0, 28.0, 34.0, 39.0):  # four in the window's first half ...
            window.observe("i", t)
        for i in range(last):  # ... then `last` in its final eighth
            window.observe("i", 55.5 + i * 0.5)
        return window

    five, eight = window_with(5).rates(60.0)["i"], window_with(8).rates(60.0)["i"]
    assert five == (pytest.approx(9 / 40.0), 0.0)  # the window's rate, no trend either
    assert eight[0] == pytest.approx(8 / 5.0)  # taken as the burst's own rate


def test_a_trend_counts_only_past_its_sigmas_of_the_halves_noise() -> None:
    """100 arrivals in the first half, 140 in the second: 2.6 sigma of Poisson noise, a
    trend at the default 2 sigma, none at 3."""
    arrivals = [i * 0.05 for i in range(100)] + [5.0 + i * 5.0 / 140 for i in range(140)]
    loose = RateWindow(window_s=10.0, noise_sigma=0.0)
    strict = RateWindow(window_s=10.0, trend_sigma=3.0, noise_sigma=0.0)
    for t in arrivals:
        strict.observe("i", t)
        loose.observe("i", t)
    assert strict.rates(10.0)["i"] == (pytest.approx(24.0), 0.0)
    assert loose.rates(10.0)["i"] == (pytest.approx(24.0), pytest.approx(40 / 5.0 / 5.0))


def test_a_steady_rate_has_no_trend_and_its_window_rate() -> None:
    window = RateWindow(window_s=10.0, noise_sigma=0.0)
    for i in range(200):
        window.observe("i", i * 0.1 + (0.03 if i % 2 else 0.0))
    assert window.rates(20.0)["i"] == (pytest.approx(10.0), 0.0)


def test_the_window_rate_is_discounted_by_its_noise_and_a_burst_is_not() -> None:
    """100 arrivals in a 10 s window: 10 jobs/s, one standard error sqrt(100) / 10 = 1
    off by default (the damper holds the largest of many such readings); a burst that
    passed the up-fast test keeps its own rate."""
    steady, plain = RateWindow(window_s=10.0), RateWindow(window_s=10.0, noise_sigma=0.0)
    for i in range(100):
        steady.observe("i", 10.0 + i * 0.1)
        plain.observe("i", 10.0 + i * 0.1)
    assert plain.rates(20.0)["i"][0] == pytest.approx(10.0)
    assert steady.rates(20.0)["i"][0] == pytest.approx(9.0)
    assert RateWindow(window_s=10.0, noise_sigma=2.0).rates(20.0) == {}
    burst = RateWindow(window_s=10.0)
    for i in range(210):  # 2 jobs/s for 5 s, then 40 jobs/s for 5 s
        burst.observe("i", 10.0 + i * 0.5 if i < 10 else 15.0 + (i - 10) / 40.0)
    assert burst.rates(20.0)["i"][0] == pytest.approx(50 / 1.25)
    with pytest.raises(ValueError, match="noise_sigma"):
        RateWindow(noise_sigma=-1.0)


def test_a_rising_window_is_not_discounted() -> None:
    """100 arrivals in the first half, 140 in the second: a trend (2.6 sigma), so the
    window's 24 jobs/s is a rise, not noise, and is taken whole; the same count spread
    evenly is discounted by its standard error."""
    rising, even = RateWindow(window_s=10.0), RateWindow(window_s=10.0)
    for t in [i * 0.05 for i in range(100)] + [5.0 + i * 5.0 / 140 for i in range(140)]:
        rising.observe("i", t)
    for i in range(240):
        even.observe("i", i * 10.0 / 240)
    rate, trend = rising.rates(10.0)["i"]
    assert trend > 0 and rate == pytest.approx(24.0)
    assert even.rates(10.0)["i"] == (pytest.approx(24.0 - math.sqrt(240) / 10.0), 0.0)


def test_decide_adds_hinted_workers_and_drains_the_cheapest() -> None:
    damper = Damper(down_window_s=5.0)
    busy = [ClassLoad("i", 40.0, {"a": 100.0}, deadline_ms=1000.0, path_ms=100.0)]
    d = decide(busy, [member("w1", "a")], SIZES, damper, 0.0)
    assert d.target == len(d.add) + 1 and d.add and all(h == ("a",) for h in d.add[:1])
    members = [member(f"w{i}", "a", backlog_ms=float(i)) for i in range(d.target)]
    quiet = [ClassLoad("i", 1.0, {"a": 100.0}, deadline_ms=1000.0, path_ms=100.0)]
    assert decide(quiet, members, SIZES, damper, 1.0).remove == ()  # inside the window
    later = decide(quiet, members, SIZES, damper, 10.0)
    assert later.target == 1
    # the idlest go first; the one with the most queued keeps the last copy of a
    assert later.remove == tuple(f"w{i}" for i in range(d.target - 1))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="horizon_s"):
        workers_needed([], [], SIZES, horizon_s=0.0)
    with pytest.raises(ValueError, match="down_window_s"):
        Damper(-1.0)
    with pytest.raises(ValueError, match="window_s"):
        RateWindow(0.0)


def test_the_burst_tests_stretch_may_be_set_apart_from_the_window() -> None:
    """A steady 2 jobs/s for 40 s, then 40 jobs/s for the last 0.5 s: a 40 s window's
    own short stretch (5 s) calls it a burst but averages it into 29 / 5 = 5.8 jobs/s;
    a 0.5 s stretch reads the burst's own rate."""
    times = [i * 0.5 for i in range(80)] + [40.0 + i / 40.0 for i in range(20)]
    default, short = RateWindow(window_s=40.0), RateWindow(window_s=40.0, short_s=0.5)
    for t in times:
        default.observe("i", t)
        short.observe("i", t)
    assert default.short_s == 5.0
    assert default.rates(40.5)["i"][0] == pytest.approx(29 / 5.0)
    assert short.rates(40.5)["i"][0] == pytest.approx(20 / 0.5)
    with pytest.raises(ValueError, match="short_s"):
        RateWindow(short_s=0.0)


def test_a_rise_may_read_the_recent_half_of_the_window() -> None:
    """100 arrivals in the first half, 140 in the second (a trend): the window's mean,
    24 jobs/s, lags its end; with ``rise_recent`` the reading is the second half's 28."""
    mean, recent = RateWindow(window_s=10.0), RateWindow(window_s=10.0, recent_on_trend=1)
    for t in [i * 0.05 for i in range(100)] + [5.0 + i * 5.0 / 140 for i in range(140)]:
        mean.observe("i", t)
        recent.observe("i", t)
    assert mean.rates(10.0)["i"][0] == pytest.approx(24.0)
    rate, trend = recent.rates(10.0)["i"]
    assert trend > 0 and rate == pytest.approx(28.0)


def test_a_burst_across_the_classes_is_seen_by_the_pooled_test() -> None:
    """Three classes at 2 jobs/s, then 7 arrivals each in the last 1.25 s (the short
    stretch): one class's 7 against 3.1 expected is no burst (about 3% by chance), the
    three's 21 against 9.4 is (under 0.1%); pooled, each class reads 7 / 1.25."""
    alone, pooled = RateWindow(window_s=10.0), RateWindow(window_s=10.0, pooled=True)
    for name in "abc":
        for t in [i * 0.5 for i in range(18)] + [8.75 + i * 0.17 for i in range(7)]:
            alone.observe(name, t)
            pooled.observe(name, t)
    assert alone.rates(10.0)["a"] == (pytest.approx(2.5 - 5 / 10.0), 0.0)  # discounted
    assert pooled.rates(10.0)["a"][0] == pytest.approx(7 / 1.25)
    assert not RateWindow(window_s=10.0, pooled=True).rates(10.0)
