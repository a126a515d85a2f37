"""Refused demand: what this process turned away for want of capacity, counted as demand.

The simulator's producer sees every arriving job, refused or not, and its demand per
model (``planner.demand``) counts them all. On a real cluster the demand is what the
workers served (``worker.served``): a model one worker cannot carry is served at that
worker's pace, and the requests it could not take never show. So the process that
refuses (the router, a Dag submission) tracks what it refused, with the class (a
refusal under a deadline is deadline-bound demand), on the tracker a worker keeps for
what it served (``planner.demand.DemandTracker``, in workload time, coarsened as a worker
publishes), and plans on the sum (``planner.demand.merge_demand``): a model refused
often wants more copies than it has (``planner.compass``, ``planner.evict``).

Each process knows its own refusals only; with several producers each sees its share.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from .planner.demand import DemandTracker, coarse_rates, merge_demand
from .planner.types import ModelDemand

if TYPE_CHECKING:
    from .context import CompassContext

#: Workload seconds between recomputations of the refused rates a plan adds.
REFRESH_S = 1.0


class Refused:
    """One app's refused demand in this process: a :class:`DemandTracker` on the
    workload clock (``monotonic() / time_scale``), its coarse rates recomputed at most
    every ``REFRESH_S`` (the same dict between: the planner's memos key on it)."""

    def __init__(self, time_scale: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.time_scale, self.clock = float(time_scale), clock
        self.tracker = DemandTracker()
        self._lock = threading.Lock()
        self._rates: dict[str, ModelDemand] = {}
        self._at: float | None = None

    def add(self, model: str, ms: float, urgent: bool) -> None:
        """One refused task needing ``model`` for ``ms`` (speed-1.0 ms)."""
        with self._lock:
            self.tracker.add(model, ms, self.clock() / self.time_scale, urgent=urgent)

    def rates(self) -> Mapping[str, ModelDemand]:
        """The coarse rates now (empty while the tracker is younger than its min age)."""
        with self._lock:
            now = self.clock() / self.time_scale
            if self._at is None or now - self._at >= REFRESH_S:
                self._at = now
                fresh = coarse_rates(self.tracker.rates(now))
                if fresh != self._rates:
                    self._rates = fresh
            return self._rates


_TRACKERS: weakref.WeakKeyDictionary[object, Refused] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def tracker(c: CompassContext) -> Refused:
    """This process's tracker of what ``c`` refused (one per app)."""
    with _LOCK:
        got = _TRACKERS.get(c)
        if got is None:
            got = _TRACKERS[c] = Refused(c.settings.time_scale)
        return got


def note(c: CompassContext, tasks: Iterable[tuple[str | None, float]], urgent: bool) -> None:
    """Count refused tasks, each (model, speed-1.0 ms), as demand for their models;
    ``urgent``: refused under a deadline."""
    t = tracker(c)
    for model, ms in tasks:
        if model is not None:
            t.add(model, ms, urgent)


def refused(c: CompassContext) -> Mapping[str, ModelDemand]:
    """What this process refused lately, per model (coarse, as a worker publishes what
    it served; the same dict until it moves); empty while nothing was refused."""
    with _LOCK:
        t = _TRACKERS.get(c)
    return {} if t is None else t.rates()


def with_refused(c: CompassContext, demand: Mapping[str, ModelDemand]
                 ) -> Mapping[str, ModelDemand]:
    """``demand`` (what the workers served) plus what this process refused lately;
    ``demand`` itself while nothing was refused."""
    return merge_demand(demand, refused(c))
