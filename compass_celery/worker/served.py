"""The demand a worker served, for its record, and the eviction order it learns back.

On a real cluster no process sees every arriving job, as the simulator's producer does.
Each worker therefore tracks the demand it *served* (``planner.demand.DemandTracker``,
fed as each task that needs a model finishes) and publishes it in its record
(``WorkerView.served``); whoever plans sums the live workers'
(``planner.demand.cluster_demand``). In a steady state what the cluster serves is what
arrives, so the sum is the demand the simulator's producer measures.

The GPU time of a task is its **measured** run time times this worker's speed: the
planner's speed-1.0 milliseconds, the unit of ``TaskSpec.exec_ms``. Measured rather than
the producer's estimate because it exists for every task that ran a model (tasks from
the shared queue, or sent with no compass header, carry no estimate) and because it
follows what the tasks really cost when the estimate is a default or stale. (An
emulated GPU sleeps ``exec_ms`` over its ``speed``, so there too the product is the
task's ``exec_ms``.)

Times are workload time: run times come in workload ms and the tracker's clock is
``monotonic() / time_scale``, so rates mean the same (1000 ms/s = one speed-1.0 worker
busy) on real GPUs and on scaled emulated ones.

The worker learns the cluster's demand back from the snapshots it reads anyway (for
successor re-placement): :class:`RankFollower` hands its cache the planner's eviction
order (``planner.evict.eviction_rank``) every ``RANK_REFRESH_S``, so the cache evicts
spare copies before the only copy of a busy model, as the plan assumed.

Every planner re-reads a record whose bytes changed, so what is published is coarse:
recomputed at most every ``DEMAND_PUBLISH_S`` workload seconds, rounded to two
significant figures, models below ``MIN_RATE_PER_S`` dropped, nothing while the tracker
is younger than its ``min_age_s``, and replaced only when a model came or went or a rate
moved by more than ``PUBLISH_TOLERANCE``. A worker that stops serving a model changes
its record every ~10 s while the rate decays (20% per ~7 s at tau 30 s), then never.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..planner.demand import DEFAULT_MIN_AGE_S, DEFAULT_TAU_S, DemandTracker, coarse_rates
from ..planner.evict import eviction_rank
from ..planner.types import ClusterView, ModelDemand

if TYPE_CHECKING:
    from ..cache import ModelCache

logger = logging.getLogger("compass_celery.worker")

#: Workload seconds between recomputations of the rates a worker publishes.
DEMAND_PUBLISH_S = 5.0
#: A published rate is replaced only when it moved by more than this share (or a model
#: came or went): Poisson noise under a steady load does not change the record.
PUBLISH_TOLERANCE = 0.2
#: Real seconds between refreshes of the cache's eviction order from the last snapshot.
RANK_REFRESH_S = 2.0


class ServedDemand:
    """One worker's served demand: fed per finished task, read by its publisher."""

    def __init__(self, speed: float, time_scale: float = 1.0, *,
                 tau_s: float = DEFAULT_TAU_S, min_age_s: float = DEFAULT_MIN_AGE_S,
                 publish_every_s: float = DEMAND_PUBLISH_S,
                 tolerance: float = PUBLISH_TOLERANCE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self.speed, self.time_scale = float(speed), float(time_scale)
        self.publish_every_s, self.clock = float(publish_every_s), clock
        self.tolerance = float(tolerance)
        self.tracker = DemandTracker(tau_s, min_age_s)
        self._lock = threading.Lock()
        self._published: dict[str, ModelDemand] = {}
        self._computed_at: float | None = None
        self._of_age = False  # the tracker was old enough to report at a recomputation

    def now_s(self) -> float:
        """Workload seconds on this worker's monotonic clock."""
        return self.clock() / self.time_scale

    def serving(self) -> None:
        """A task starts here: the first one opens the tracker's window."""
        with self._lock:
            self.tracker.open(self.now_s())

    def ran(self, model: str, run_ms: float, urgent: bool = False) -> None:
        """A task needing ``model`` ran for ``run_ms`` workload ms on this worker;
        ``urgent``: its job had a deadline (its class's demand keeps the model resident)."""
        with self._lock:
            self.tracker.add(model, max(0.0, run_ms) * self.speed, self.now_s(),
                             urgent=urgent)

    def published(self) -> Mapping[str, ModelDemand]:
        """The coarse rates to publish now: the same dict object until a recomputation
        finds a model came or went or a rate moved by more than ``tolerance``.

        Recomputed every ``publish_every_s``, and also at once when the tracker comes of
        age: the first rates would otherwise wait for the next recomputation, up to
        ``publish_every_s`` after the simulator's producer has them, each worker at its own
        moment, and meanwhile the planner protects no replica and loads more."""
        with self._lock:
            now = self.now_s()
            came_of_age = not self._of_age and self.tracker.ready(now)
            if not came_of_age and self._computed_at is not None \
                    and now - self._computed_at < self.publish_every_s:
                return self._published
            self._computed_at = now
            self._of_age = self._of_age or came_of_age
            fresh = coarse_rates(self.tracker.rates(now))
            if _moved(self._published, fresh, self.tolerance):
                self._published = fresh
            return self._published


def _moved(old: Mapping[str, ModelDemand], new: Mapping[str, ModelDemand],
           tolerance: float) -> bool:
    """Whether ``new`` is worth a record change: another set of models, or a rate that
    moved by more than ``tolerance`` (relative) from what was published."""
    if old.keys() != new.keys():
        return True
    return any(abs(n.ms_per_s - o.ms_per_s) > tolerance * o.ms_per_s
               or abs(n.per_s - o.per_s) > tolerance * o.per_s
               or abs(n.urgent_per_s - o.urgent_per_s) > tolerance * o.urgent_per_s
               for o, n in ((old[m], new[m]) for m in new))



class RankFollower:
    """Gives a cache the planner's eviction order from the cluster view ``read`` returns
    (None: no state now), at most every ``every_s`` real seconds."""

    def __init__(self, cache: ModelCache, read: Callable[[], ClusterView | None],
                 every_s: float = RANK_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache, self.read, self.every_s, self.clock = cache, read, float(every_s), clock
        self._at: float | None = None
        self.refreshes = 0

    def maybe_refresh(self) -> bool:
        """Refresh the cache's rank if it is due; True when it was refreshed. Never
        raises: the publisher thread that calls it must not die of a bad read."""
        now = self.clock()
        if self._at is not None and now - self._at < self.every_s:
            return False
        self._at = now
        try:
            cluster = self.read()
            if cluster is None:
                return False
            self.cache.set_rank(eviction_rank(cluster))
        except Exception as exc:  # advisory: the cache falls back to what it had
            logger.warning("compass: cache eviction order not refreshed: %s", exc)
            return False
        self.refreshes += 1
        return True
