"""Recent demand per model, and how many workers should keep each model resident.

Demand is what arrives, not what a worker happens to run: per model, the GPU time its
tasks ask for (ms per second, so 1000 = one speed-1.0 worker kept busy) and how often a
task needs it (tasks per second). :class:`DemandTracker` estimates both as exponentially
decaying rates from what it is shown; it does no I/O and reads no clock (``now_s`` is
passed in), so whoever plans jobs can keep one: the simulator keeps one per run and feeds
it every arriving job. The result travels to the planner as ``ClusterView.demand``.

:func:`replica_targets` turns demand into replicas: a model whose tasks keep ``d``
workers busy should be resident on ``ceil(d / REPLICA_BUSY)`` workers (at least one
while anything asks for it), so that no replica is asked for more than ``REPLICA_BUSY``
of a worker's time. The planner charges a placement that would evict a model below its
target with that model's expected reload (see ``planner.evict``).

On a real cluster nobody sees every arriving job, so each worker tracks the demand it
served and publishes it, coarsened by :func:`coarse_rates`, as ``WorkerView.served``;
whoever plans sums the live workers' with :func:`cluster_demand` (or, carried from view
to view, :class:`DemandSum`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .types import DagSpec, ModelDemand, WorkerView

#: Time constant of the rate estimates, seconds: long enough to smooth Poisson noise
#: (a model asked for twice a second is seen ~60 times per window), short enough to
#: follow a shift of the job mix within a minute or two.
DEFAULT_TAU_S = 30.0
#: The share of one worker's time a replica should serve at most.
REPLICA_BUSY = 0.8
#: Below this demand (tasks per second) a model has no replica target: nothing keeps it.
MIN_RATE_PER_S = 1e-3
#: A tracker younger than this (seconds since its first job) reports no demand: a few
#: seconds of arrivals say little about rates, and a cold cluster should fill its memory
#: by earliest finish alone before copies are protected.
DEFAULT_MIN_AGE_S = 10.0


class DemandTracker:
    """Exponentially decaying per-model rates: GPU ms per second and tasks per second."""

    def __init__(self, tau_s: float = DEFAULT_TAU_S,
                 min_age_s: float = DEFAULT_MIN_AGE_S) -> None:
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s!r}")
        self.tau_s = float(tau_s)
        self.min_age_s = float(min_age_s)
        self._ms: dict[str, float] = {}  # decayed sums at self._t
        self._n: dict[str, float] = {}
        self._u: dict[str, float] = {}  # the part of _n asked for by jobs with a deadline
        self._t: float | None = None
        self._t0: float | None = None
        # the last rates and the clock they were read at, until a task is added: a
        # simulated cluster reads them for every snapshot, several at one moment
        self._read: tuple[float, dict[str, ModelDemand]] | None = None

    def _decay_to(self, now_s: float) -> None:
        if self._t is None:
            self._t = self._t0 = now_s
            return
        dt = now_s - self._t
        if dt <= 0:
            return
        f = math.exp(-dt / self.tau_s)
        for d in (self._ms, self._n, self._u):
            for k in d:
                d[k] *= f
        self._t = now_s

    def open(self, now_s: float) -> None:
        """Open the window at ``now_s`` unless it is open: a worker, which adds a task as it
        ends, opens it as its first task starts, as the simulator's opens at the first
        arrival, so that its rates come of age as early."""
        if self._t is None:
            self._t = self._t0 = now_s
            self._read = None

    def add(self, model: str, exec_ms: float, now_s: float, count: float = 1.0,
            urgent: bool = False) -> None:
        """Record ``count`` tasks needing ``model`` for ``exec_ms`` each, arriving at
        ``now_s``; ``urgent``: asked for by a job with a deadline."""
        self._read = None
        self._decay_to(now_s)
        self._ms[model] = self._ms.get(model, 0.0) + exec_ms * count
        self._n[model] = self._n.get(model, 0.0) + count
        if urgent:
            self._u[model] = self._u.get(model, 0.0) + count

    def observe(self, dag: DagSpec, now_s: float, urgent: bool = False) -> None:
        """Record every task of a job arriving at ``now_s`` (refused or not: a refusal
        for want of capacity is demand the cluster did not carry)."""
        for task in dag.nodes.values():
            if task.model is not None:
                self.add(task.model, task.exec_ms, now_s, urgent=urgent)

    def ready(self, now_s: float) -> bool:
        """Whether :meth:`rates` reports at ``now_s``: a task seen, ``min_age_s`` ago or more."""
        return self._t is not None and self._t0 is not None \
            and max(now_s, self._t) - self._t0 >= self.min_age_s

    def rates(self, now_s: float) -> dict[str, ModelDemand]:
        """Per model, the current rate estimates (bias-corrected while younger than tau);
        empty while the tracker is younger than ``min_age_s``. Read again at the same
        ``now_s`` with no task added since, the same dict (callers must not change it),
        so what is memoised by the demand's identity (``planner.evict``) holds."""
        read = self._read
        if read is not None and read[0] == now_s:
            return read[1]
        rates = self._rates(now_s)
        self._read = (now_s, rates)
        return rates

    def _rates(self, now_s: float) -> dict[str, ModelDemand]:
        if self._t is None or self._t0 is None or not self.ready(now_s):
            return {}
        t = max(now_s, self._t)
        age = t - self._t0
        f = math.exp(-(t - self._t) / self.tau_s)
        # A window that opened at t0 has seen only 1 - exp(-age/tau) of a full one.
        seen = -math.expm1(-age / self.tau_s) if age > 0 else 0.0
        scale = f / (self.tau_s * seen) if seen > 0 else 0.0
        if scale == 0.0:
            return {}
        n, u = self._n, self._u
        return {m: _demand(ms * scale, n[m] * scale, u.get(m, 0.0) * scale)
                for m, ms in self._ms.items()}


def _demand(ms_per_s: float, per_s: float, urgent_per_s: float) -> ModelDemand:
    """``ModelDemand(ms_per_s, per_s, urgent_per_s)`` without the frozen dataclass's
    constructor (a field at a time through ``object.__setattr__``): a simulated cluster
    reads the rates at nearly every event, ten models each."""
    d = object.__new__(ModelDemand)
    d.__dict__.update(ms_per_s=ms_per_s, per_s=per_s, urgent_per_s=urgent_per_s)
    return d


def replica_targets(
    demand: Mapping[str, ModelDemand], holders: Mapping[str, int] | None = None,
    busy: float = REPLICA_BUSY,
) -> dict[str, int]:
    """Model -> workers that should keep it resident; ``holders`` caps it (workers it fits)."""
    out: dict[str, int] = {}
    for model, d in demand.items():
        want = replica_target(d, None if holders is None else holders.get(model), busy)
        if want is not None:
            out[model] = want
    return out


def replica_target(d: ModelDemand, cap: int | None = None, busy: float = REPLICA_BUSY
                   ) -> int | None:
    """One model's :func:`replica_targets` entry (None: it has none), at most ``cap``."""
    if d.per_s < MIN_RATE_PER_S:
        return None
    want = max(1, math.ceil(d.ms_per_s / (1000.0 * busy) - 1e-9))
    return want if cap is None else min(want, cap)



#: Significant figures of a published rate: coarse, so that a worker's record (re-read by
#: every planner whenever its bytes change) does not change with every task.
PUBLISH_DIGITS = 2


def coarse_rates(rates: Mapping[str, ModelDemand],
                 digits: int = PUBLISH_DIGITS) -> dict[str, ModelDemand]:
    """``rates`` rounded to ``digits`` significant figures, dropping models asked for less
    than ``MIN_RATE_PER_S`` (which no replica target counts): once a worker's rates have
    decayed, what it publishes stops changing."""
    out: dict[str, ModelDemand] = {}
    for model, d in sorted(rates.items()):
        if d.per_s < MIN_RATE_PER_S:
            continue
        out[model] = ModelDemand(float(f"{d.ms_per_s:.{digits}g}"),
                                 float(f"{d.per_s:.{digits}g}"),
                                 float(f"{d.urgent_per_s:.{digits}g}"))
    return out


def merge_demand(a: Mapping[str, ModelDemand], b: Mapping[str, ModelDemand]
                 ) -> Mapping[str, ModelDemand]:
    """Two demands summed per model (``a`` itself when ``b`` is empty): what the
    workers served and what a producer refused for want of capacity, the demand the
    simulator's producer sees as every arrival."""
    if not b:
        return a
    out = dict(a)
    for model, d in b.items():
        o = out.get(model)
        out[model] = d if o is None else ModelDemand(
            o.ms_per_s + d.ms_per_s, o.per_s + d.per_s, o.urgent_per_s + d.urgent_per_s)
    return out


def cluster_demand(workers: Iterable[WorkerView]) -> dict[str, ModelDemand]:
    """The cluster's recent demand: per model, the sum of what the workers served."""
    return DemandSum(workers).demand


class DemandSum:
    """:func:`cluster_demand` kept up to date row by row: a worker whose ``served``
    changed is taken out and put back in, in O(its models), not O(workers).

    Per model it keeps the two sums and how many workers contribute, so a model nobody
    serves any more disappears exactly (no float residue left behind).
    """

    def __init__(self, workers: Iterable[WorkerView] = ()) -> None:
        # model -> [ms_per_s, per_s, contributors, urgent_per_s]
        self._sums: dict[str, list[float]] = {}
        for w in workers:
            self._add(w.served, 1.0)
        self._demand = self._freeze()

    def _add(self, served: Mapping[str, ModelDemand], sign: float) -> None:
        sums = self._sums
        for model, d in served.items():
            acc = sums.get(model)
            if acc is None:
                acc = sums[model] = [0.0, 0.0, 0.0, 0.0]
            acc[0] += sign * d.ms_per_s
            acc[1] += sign * d.per_s
            acc[2] += sign
            acc[3] += sign * d.urgent_per_s
            if acc[2] <= 0:
                del sums[model]

    def _freeze(self) -> dict[str, ModelDemand]:
        return {m: ModelDemand(max(0.0, a[0]), max(0.0, a[1]), max(0.0, a[3]))
                for m, a in sorted(self._sums.items())}

    @property
    def demand(self) -> dict[str, ModelDemand]:
        """The current sum (the same dict until a row's ``served`` changes)."""
        return self._demand

    def replace(self, old: WorkerView, new: WorkerView) -> bool:
        """Swap one worker's row; True when the sum changed (``demand`` is a new dict)."""
        if _same_served(old, new):
            return False
        self._add(old.served, -1.0)
        self._add(new.served, 1.0)
        self._demand = self._freeze()
        return True

    def replaced(self, rows: Iterable[tuple[WorkerView, WorkerView]]) -> DemandSum:
        """This sum with each (old, new) row swapped: itself when no row's ``served``
        changed, else a copy (another view may still be carried from this one)."""
        out = self
        for old, new in rows:
            if not _same_served(old, new):
                if out is self:
                    out = self.copy()
                out.replace(old, new)
        return out

    def copy(self) -> DemandSum:
        """An independent copy (a carried view's sum must not change an older view's)."""
        out = DemandSum()
        out._sums = {m: list(a) for m, a in self._sums.items()}
        out._demand = self._demand
        return out


def _same_served(old: WorkerView, new: WorkerView) -> bool:
    return old.served is new.served or old.served == new.served
