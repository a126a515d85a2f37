"""A worker's first served rates go out as soon as its tracker is old enough to give them.

The simulator's producer has the cluster's demand ``min_age_s`` after the first job. A
worker that recomputed what it publishes only every ``DEMAND_PUBLISH_S`` published its
first rates up to that much later, each worker at its own moment: on the emulated
cluster the planner saw no demand until ~15 s into a run, then part of it, where the
simulator had all of it at 10 s, and it loaded models meanwhile that its own simulator
did not (issue 22, part 3).
"""

from __future__ import annotations

from compass_celery.planner.demand import DEFAULT_MIN_AGE_S, DemandTracker
from compass_celery.worker.served import DEMAND_PUBLISH_S, ServedDemand


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_first_rates_are_published_when_the_tracker_comes_of_age() -> None:
    clock = Clock()
    served = ServedDemand(speed=1.0, clock=clock)
    assert served.published() == {}  # the worker's first record, before any task
    clock.t = 2.0  # its first task ends 2 s later: the tracker's window opens then
    published_at = None
    while clock.t < 2.0 + DEFAULT_MIN_AGE_S + DEMAND_PUBLISH_S:
        served.ran("busy", 100.0)  # a task ends (and the record is published) every 0.5 s
        if served.published() and published_at is None:
            published_at = clock.t
        clock.t += 0.5
    assert published_at == 2.0 + DEFAULT_MIN_AGE_S  # not at the next 5 s recomputation


def test_after_the_first_rates_recomputation_keeps_its_cadence() -> None:
    clock = Clock()
    served = ServedDemand(speed=1.0, clock=clock)
    served.published()
    for _ in range(21):  # 10 s of one 100 ms task every 0.5 s: of age at t = 10
        served.ran("busy", 100.0)
        first = served.published()
        clock.t += 0.5
    assert set(first) == {"busy"}
    for _ in range(8):  # then twice the demand, for 4 s: still the first rates
        served.ran("busy", 100.0)
        served.ran("busy", 100.0)
        assert served.published() is first
        clock.t += 0.5


def test_tracker_ready_exactly_when_it_reports() -> None:
    tracker = DemandTracker(min_age_s=10.0)
    assert not tracker.ready(100.0)  # nothing seen
    tracker.add("m", 100.0, 5.0)
    assert not tracker.ready(14.9) and tracker.rates(14.9) == {}
    assert tracker.ready(15.0) and set(tracker.rates(15.0)) == {"m"}


def test_the_window_opens_as_the_first_task_starts() -> None:
    clock = Clock()
    served = ServedDemand(speed=1.0, clock=clock)
    served.serving()  # the first task starts at 0 (its model loads, then it runs)
    clock.t = 2.5
    served.ran("busy", 500.0)  # and ends 2.5 s later
    clock.t = DEFAULT_MIN_AGE_S
    assert set(served.published()) == {"busy"}  # of age 10 s after the start, as simulated
