"""The controller loop (providers.Autoscaler) against a recording provider and a cluster
it describes: it scales out with the rule's hints, records whether a new worker's first
record held them, drains the worker the rule chose once the down window passed, and bills
each worker from its add to the end of its drain; ticked on the simulator's schedule, its
damper holds a recommendation as long as the simulator's does."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from compass_celery.bench.autoscaled import _ticker
from compass_celery.cli.common import load
from compass_celery.planner.types import WorkerView
from compass_celery.providers import Autoscaler


class Recording:
    """A provider that only records; ``live`` is what the cluster snapshot shows."""

    def __init__(self, named: bool = True) -> None:
        self.named, self.made = named, 0
        self.up: list[str] = []
        self.added: list[tuple[str, ...]] = []
        self.removed: list[str] = []

    def names(self) -> list[str]:
        return list(self.up)

    def add(self, preload: Sequence[str] = ()) -> str:
        self.made += 1
        self.added.append(tuple(preload))
        name = f"w{self.made}@t"
        self.up.append(name)
        return name if self.named else ""

    def remove(self, name: str) -> None:
        self.up.remove(name)
        self.removed.append(name)


def _view(name: str, resident: Sequence[str], backlog_ms: float = 0.0) -> WorkerView:
    return WorkerView(name, f"q.{name}", 4000.0, 1000.0, resident=frozenset(resident),
                      backlog_ms=backlog_ms)


def test_scale_out_hints_then_scale_in_drains_the_chosen_worker_and_bills() -> None:
    workload = load("autoscale-mix")
    models = sorted(workload.models)
    provider, now = Recording(), [0.0]
    live: dict[str, WorkerView] = {}
    scaler = Autoscaler(provider, workload, lambda: list(live.values()), window_s=10.0,
                        down_window_s=5.0, horizon_s=2.0, gpu_mb=4000.0,
                        clock=lambda: now[0])
    first = scaler.add(models)
    live[first] = _view(first, models)
    for i in range(300):  # 30 interactive jobs/s for 10 s: several workers' work
        scaler.observe("interactive", i / 30.0)
    now[0] = 10.0
    d = scaler.tick()
    assert d.target > 1 and len(provider.up) == d.target
    assert ("captioner" in provider.added[1]  # the most-asked model gets its copies first
            and not any(provider.added[-1]))  # the last have nothing missing left to load
    for name, hint in zip(provider.up[1:], provider.added[1:], strict=True):
        live[name] = _view(name, hint)  # its first record: the hint resident
    now[0] = 11.0
    scaler.tick()
    assert set(scaler.first_seen) == set(provider.up)  # the first worker too
    assert all(s["hint_resident"] for s in scaler.first_seen.values())

    # the arrivals stop; only after the down window does the fleet shrink, and the rule
    # drains the workers whose loss costs least (here: not the one with queued work)
    live[first] = _view(first, models, backlog_ms=5000.0)
    now[0] = 14.0  # within the down window of the peak's decision (at 10)
    assert scaler.tick().remove == ()
    added = dict(scaler.since)  # name -> when it was asked for
    now[0] = 40.0
    d = scaler.tick()
    assert d.remove and first not in d.remove
    billed = scaler.close()
    assert provider.removed == list(d.remove)
    # the first worker from 0, the others from 10 (one more may have come at 14 for the
    # first worker's backlog), all billed until now (40 s): the drains end at once here,
    # at the fake clock's 40
    assert added[first] == 0.0 and set(added.values()) <= {0.0, 10.0, 14.0}
    assert len(added) == provider.made
    assert billed == sum(40.0 - t for t in added.values())


def test_a_provider_that_cannot_name_its_workers_yet_is_driven_all_the_same() -> None:
    workload = load("autoscale-mix")
    provider = Recording(named=False)
    scaler = Autoscaler(provider, workload, lambda: [], window_s=10.0, down_window_s=5.0,
                        horizon_s=2.0, gpu_mb=4000.0, clock=lambda: 10.0)
    for i in range(300):
        scaler.observe("interactive", i / 30.0)
    d = scaler.tick()
    assert len(provider.added) == d.target  # starting pods count as capacity coming
    scaler.tick()
    assert len(provider.added) == d.target  # and are not asked for twice
    assert scaler.close() == 0.0  # nothing it could bill


def _ticks(scheduled: bool) -> list[dict[str, object]]:
    """A burst, then nothing, ticked every 3 s by a loop whose clock drifts 0.01 s a tick
    (a sleep of a period after each tick); ``scheduled``: each tick given its schedule's
    time, as the simulator ticks."""
    workload = load("autoscale-mix")
    now = [0.0]
    scaler = Autoscaler(Recording(), workload, lambda: [], window_s=10.0,
                        down_window_s=30.0, horizon_s=2.0, gpu_mb=4000.0,
                        clock=lambda: now[0])
    for i in range(300):  # 30 interactive jobs/s for 10 s
        scaler.observe("interactive", i / 30.0)
    for k in range(4, 30):
        now[0] = 3.0 * k + 0.01 * k
        scaler.tick(3.0 * k if scheduled else None)
    return scaler.readings


def _held_for(readings: list[dict[str, object]]) -> float:
    """Seconds from the last tick that asked for more than the final fleet to the first
    tick whose target came down to it."""
    final = readings[-1]["target"]
    asked = [r["t"] for r in readings if max(r["now"], r["horizon"]) > final]  # type: ignore[call-overload]
    down = next(r["t"] for r in readings if r["t"] > asked[-1] and r["target"] == final)
    return float(down) - float(asked[-1])  # type: ignore[arg-type]


def test_scheduled_ticks_hold_a_recommendation_for_the_whole_down_window() -> None:
    """The damper holds a recommendation while it is at most down_window_s (30 s) old: on
    the simulator's ticks (3 s apart) for 10 ticks, so the fleet shrinks 33 s after the
    last tick that asked for more. A loop whose ticks drift (3.01 s apart) shrank it one
    tick early (the real controller scaled in 3 s before its simulation each time)."""
    scheduled = _ticks(scheduled=True)
    assert [r["t"] for r in scheduled] == [3.0 * k for k in range(4, 30)]
    assert _held_for(scheduled) == 33.0
    assert _held_for(_ticks(scheduled=False)) < 31.0  # a tick early


class _Clocked:
    """What the ticker drives: a clock and a tick that records when it was scheduled."""

    def __init__(self, slow_s: float = 0.0) -> None:
        self.t0, self.slow_s = time.monotonic(), slow_s
        self.ticks: list[tuple[float, float]] = []  # (scheduled, clock at the tick)

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def tick(self, now: float | None = None) -> None:
        self.ticks.append((float(now if now is not None else -1.0), self.clock()))
        if len(self.ticks) == 1:
            time.sleep(self.slow_s)  # a slow first tick: the ticks it overran are skipped


def test_the_ticker_ticks_on_a_fixed_schedule_and_skips_what_it_overran() -> None:
    scaler = _Clocked(slow_s=0.6)
    stop = threading.Event()
    _ticker(scaler, 0.25, 2.0, stop).join(timeout=10.0)  # type: ignore[arg-type]
    due = [s for s, _ in scaler.ticks]
    assert due[0] == 0.25 and all(s % 0.25 == 0 for s in due)  # k x period, exactly
    assert all(b > a for a, b in zip(due, due[1:], strict=False))  # none run twice
    assert 0.5 not in due  # overrun by the slow first tick: skipped, not run late
    assert due[-1] == 1.75 and all(at >= s - 1e-3 for s, at in scaler.ticks)
