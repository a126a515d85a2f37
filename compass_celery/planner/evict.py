"""What a model load evicts, priced: the reloads it causes later.

Earliest finish alone counts a load's own time (doubled when memory must be freed) but
not what the eviction costs the jobs after this one. Under sustained load that trade
thrashes: a load on an idle worker pushes out a model that the next job needs, which is
then reloaded elsewhere, pushing out another. With the cluster's recent demand
(``ClusterView.demand``) the planner can price it:

* each model has a replica target (``demand.replica_targets``): enough resident copies
  that none serves more than ``REPLICA_BUSY`` of a worker;
* a copy at or below its model's target is kept: evicting it costs ``KEPT_WEIGHT``
  reloads (size over the worker's load bandwidth);
* a copy above target is spare: the model stays resident elsewhere, but the copy was
  absorbing part of its queue, and pricing it at zero lets copies chase queues round
  the cluster (measured on ``multi-model.json``: 3x the loads); it costs
  ``SPARE_WEIGHT`` reloads;
* both are weighted by the chance that the model is asked for within ``HORIZON_S``
  (``1 - exp(-tasks per second x HORIZON_S)``), so a model nobody uses is free to go;
* a kept copy of a model that jobs with a deadline ask for (``urgent_per_s`` at least
  ``URGENT_MIN_PER_S``) is **protected** from a batch load (a plan with no deadline to
  meet): evicting it costs ``PROTECT_WEIGHT`` times more, and it is evicted last. The
  batch task waits for a worker that has room, or takes it from batch models; the
  class with a deadline keeps its models while its demand lasts (the rate decays over
  ``planner.demand.DEFAULT_TAU_S`` once it stops).

A load that needs ``size - free`` MB is assumed to evict spare copies first, then kept
ones, least worth per MB first (:func:`eviction_rank` hands the worker's cache
the same order: ``CacheDecider.rank``). :class:`EvictionPricer` prices that for every
worker at once; the price is added to the finish when choosing (never to the estimate).
With no demand known, every price is zero and compass plans exactly as before.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .cost import Hidden, WorkerArrays, _np_min, worker_arrays
from .demand import replica_target
from .types import ClusterView, ModelDemand

#: Horizon for "will this model be asked for again soon", seconds.
HORIZON_S = 10.0
#: Reloads a kept copy's eviction is expected to cause (times the chance it is asked for).
KEPT_WEIGHT = 2.0
#: The same for a spare copy (its model stays resident elsewhere).
SPARE_WEIGHT = 1.0
#: Deadline-bound tasks per second from which a model's kept copies are protected from
#: batch loads: one within ``HORIZON_S``.
URGENT_MIN_PER_S = 1.0 / HORIZON_S
#: How much more a batch load's eviction of a protected copy costs: enough that batch
#: work waits for another worker (or evicts batch models) rather than take it.
PROTECT_WEIGHT = 100.0
#: A worker with this much work queued (ms) is busy for good: a load there takes its
#: time from the tasks queued after it, not from idle time (``busy_load_price``).
BUSY_HORIZON_MS = 500.0
#: Times a busy worker's load is counted again, as the capacity it takes from others.
BUSY_WEIGHT = 1.0


class EvictionPricer:
    """Per-plan eviction prices; ``resident`` is the plan's own copy, updated on commit.

    What depends only on the snapshot (sizes, replica targets, chances, copy counts) is
    worked out once per residency, capacity and demand (:func:`_snapshot_terms`): a
    routed decision's view differs from the last one by backlog charges, which change
    none of them, and at 1,000 workers working them out again cost more than the plan.
    The residency matrix and copy counts are copied on the plan's first load only.
    """

    def __init__(self, arrays: WorkerArrays, demand: Mapping[str, ModelDemand],
                 sizes_mb: Mapping[str, float], batch: bool = False) -> None:
        self.arr = arrays
        self.active = bool(demand)
        #: the loads priced are a batch plan's (no deadline): protected copies cost more
        self.batch = batch
        terms = _snapshot_terms(arrays, demand, sizes_mb)
        self.sizes, self.target, self.chance, self.copies, self.urgent, sound = terms
        #: every price is a number at least 0 (:meth:`choice_price` relies on it): the
        #: terms' sizes and chances are (the weights are), and the per-MB load times
        self._sound = sound and _rates_sound(arrays.ms_per_mb)
        self.resident = arrays.resident
        self._owned = False  # resident and copies are still the shared ones
        # The victim orders, shared by the pricers of the same terms and kind of plan
        # (every plan and re-placement on one snapshot) until a mark changes which
        # copies are kept: then this pricer's own.
        self._victims: _Victims = _memo(_VICTIMS, (terms, batch), _Victims)

    def mark(self, i: int, model: str) -> None:
        """Worker ``i`` will hold ``model`` (a placement loaded it there)."""
        j = self.arr.models[model]
        if self.active and not self.resident[i, j]:
            if not self._owned:
                self.resident, self.copies = self.resident.copy(), self.copies.copy()
                self._owned = True
            self.resident[i, j] = True
            if self.copies[j] == self.target[j]:  # its copies stop being kept: the
                self._victims = _Victims()  # victim orders change (nothing else does)
            self.copies[j] += 1

    def wants_copy(self, model: str) -> bool:
        """Whether ``model`` has fewer copies than its replica target: its demand (served
        and refused) needs another (``planner.compass.copy_worker``)."""
        j = self.arr.models[model]
        return bool(self.copies[j] < self.target[j])

    def evicts_kept(self, model: str, size_mb: float, free_mb: np.ndarray,
                    load: np.ndarray) -> np.ndarray:
        """Per worker: a load of ``model`` there must evict a kept copy (of another model:
        one its demand needs) to make room, spare copies and unwanted models not being
        enough."""
        out = np.zeros(len(self.arr), dtype=bool)
        if not self.active:
            return out
        rows = np.flatnonzero((load > 0) & (size_mb - free_mb > 0))
        if not len(rows):
            return out
        j = self.arr.models[model]
        other = ~self.kept()
        other[j] = False  # its own copies are not what a load of it evicts
        room = (self.resident[rows] & other) @ self.sizes
        out[rows] = size_mb - free_mb[rows] > room
        return out

    def kept(self) -> np.ndarray:
        """Per model: evicting one copy would leave fewer than its target."""
        return self.copies <= self.target

    def protected(self) -> np.ndarray:
        """Per model: a kept copy that live deadline-bound demand needs."""
        return self.kept() & self.urgent

    def tier(self) -> np.ndarray:
        """Per model, its copies' eviction tier, lowest evicted first: 0 spare, 1 kept,
        2 protected (``protected``)."""
        return self.kept().astype(float) + self.protected()

    def worth(self) -> np.ndarray:
        """Per model, the reloads one copy's eviction is expected to cause, per ms of its
        load: ``KEPT_WEIGHT`` or ``SPARE_WEIGHT``, times the chance that the model is
        asked for within ``HORIZON_S``; for a batch plan, a protected copy's times
        ``PROTECT_WEIGHT``."""
        worth = self.chance * np.where(self.kept(), KEPT_WEIGHT, SPARE_WEIGHT)
        if self.batch:
            worth = worth * np.where(self.protected(), PROTECT_WEIGHT, 1.0)
        return worth

    def price(self, model: str, size_mb: float, free_mb: np.ndarray,
              load: np.ndarray) -> np.ndarray:
        """ms of future reloads a load of ``model`` on each worker causes (0: none)."""
        if not self.active:
            return np.zeros(len(self.arr))
        need = size_mb - free_mb
        return self._price_rows(model, need, self._evicts(model, need, load))

    def choice_price(self, model: str, size_mb: float, free_mb: np.ndarray,
                     load: np.ndarray, finish: np.ndarray, mask: np.ndarray | None,
                     keep: Iterable[int] = ()) -> np.ndarray:
        """:meth:`price`, worked out only where a choice of the least ``finish`` + price
        over ``mask`` (None: every worker) can fall, and at ``keep``; 0 elsewhere.

        A worker whose load evicts nothing has price 0, so its score is its finish; the
        least of those, ``bound``, is a score the choice can have. A price is never
        negative (``_sound``), so a worker whose finish is past ``bound`` scores past
        it whatever its price: it can be neither the choice nor tied with it, and
        pricing it at 0 leaves it past ``bound`` too. The choice, its ties and the
        scores at and below ``bound`` are the same as with every price; only scores
        that cannot win differ (hence ``keep``: the rows a caller reads besides the
        choice). Eviction prices are the planner's costliest term (a 2-D pass over the
        evicting workers' residency); most evicting workers are idle ones that finish
        far later than a worker holding the model."""
        if not self.active:
            return np.zeros(len(self.arr))
        need = size_mb - free_mb
        evicts = self._evicts(model, need, load)
        if self._sound:
            settle = ~evicts if mask is None else mask & ~evicts
            # the least finish where nothing is evicted (inf: no such worker; a NaN there
            # is the least, as argmin takes it): one reduction over the rows picked out
            # (a reduction with where= costs more than the gather)
            bound = np.minimum.reduce(finish[settle], initial=math.inf)
            if bound < math.inf:  # not NaN, not infinite: a choice by score, not the fallback
                near = finish <= bound
                for i in keep:
                    near[i] = True
                evicts &= near
        return self._price_rows(model, need, evicts)

    def busy_price(self, load: np.ndarray, hidden: Any, avail_ms: np.ndarray,
                   finish: np.ndarray, mask: np.ndarray | None,
                   keep: Iterable[int] = ()) -> np.ndarray:
        """:func:`busy_load_price`, worked out only where a choice of the least ``finish``
        + busy price + :meth:`choice_price` over ``mask`` (None: every worker) can fall,
        and at ``keep``; 0 elsewhere.

        Where nothing loads (``load`` not above 0) both prices are 0 by their rules, so
        the least ``finish`` there, ``bound``, is a score the choice can have; both
        prices are never negative (``_sound``, and finite finishes and hidden parts:
        checked), so a worker whose finish is past ``bound`` scores past it with or
        without them. The choice, its ties and every score at or below ``bound`` are
        as with every price (``choice_price`` then prunes the same rows); past capacity
        most workers are busy and cold, and their hidden loads cost seven passes."""
        if not (self._sound and _finite(finish) and (
                hidden is None or (hidden.sound() if isinstance(hidden, Hidden)
                                   else _finite(hidden)))):
            return busy_load_price(load, hidden, avail_ms)
        loads = load > 0.0
        free = ~loads if mask is None else mask & ~loads
        bound = np.minimum.reduce(finish[free], initial=math.inf)
        if not bound < math.inf:
            return busy_load_price(load, hidden, avail_ms)
        near = finish <= bound
        for i in keep:
            near[i] = True
        return busy_load_price(load, hidden, avail_ms, loads & near)

    def prices(self, model: str, size_mb: float, free_mb: np.ndarray, load: np.ndarray,
               hidden: Any, avail_ms: np.ndarray, finish: np.ndarray,
               mask: np.ndarray | None, keep: Iterable[int] = ()
               ) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`busy_price`, :meth:`choice_price` with ``finish`` plus that busy
        price), the same arrays, element for element, worked out together.

        Where nothing loads both prices are 0, so the least ``finish`` there, ``bound``,
        is a score the choice can have, and only workers that finish at or below it (and
        ``keep``) can be priced by either: ``choice_price``'s own bound is at most
        ``bound`` (it takes the least of a set that holds ``bound``'s worker, unpriced),
        and a score at or below it has a finish at or below ``bound`` (both prices are
        never negative). So both are worked out on those few rows' gathered values, not
        on every worker's column (some thirty passes over 1,000 workers per task past
        capacity, where most workers are busy and cold); with no such bound, or terms
        that are not sound, the two methods' own passes."""
        keep = tuple(keep)
        if not self._sound or not _finite(finish) or not (
                hidden is None or (hidden.sound() if isinstance(hidden, Hidden)
                                   else _finite(hidden))):
            return self._two_prices(model, size_mb, free_mb, load, hidden, avail_ms, finish,
                                    mask, keep)
        # finish finite: so is load, and load <= 0 is ~(load > 0)
        free = load <= 0.0 if mask is None else mask & (load <= 0.0)
        bound = np.minimum.reduce(finish[free], initial=math.inf)
        if not bound < math.inf:
            return self._two_prices(model, size_mb, free_mb, load, hidden, avail_ms, finish,
                                    mask, keep)
        near = finish <= bound
        for i in keep:
            near[i] = True
        rows = near.nonzero()[0]  # every row either price can be above 0 at: few
        if len(rows) <= _FEW_ROWS:
            return self._few_prices(model, size_mb, free_mb, load, hidden, avail_ms, finish,
                                    mask, keep, rows.tolist(), bound)
        busy = np.zeros(len(self.arr))
        load_r = load[rows]
        loads_r = load_r > 0.0
        busy_rows = rows[loads_r & (avail_ms[rows] > 0.0)]
        if len(busy_rows):  # busy_load_price's rule at its rows, float for float
            if hidden is None:
                paid = load[busy_rows]
            elif isinstance(hidden, np.ndarray):
                paid = load[busy_rows] - hidden[busy_rows]
            elif len(busy_rows) <= 32:
                paid = load[busy_rows] - np.asarray(
                    [hidden[i] for i in busy_rows.tolist()], dtype=float)
            else:
                paid = load[busy_rows] - hidden.array()[busy_rows]
            busy[busy_rows] = paid * np.minimum(avail_ms[busy_rows] / BUSY_HORIZON_MS,
                                                1.0) * BUSY_WEIGHT
        if not self.active:
            return busy, np.zeros(len(self.arr))
        # choice_price at those rows: its evicting rows, its bound, its pruning
        need_r = size_mb - free_mb[rows]
        evicts_r = loads_r & (need_r > 0)
        self._not_loading(model, rows, evicts_r)
        base_r = finish[rows] + busy[rows]
        settle_r = ~evicts_r if mask is None else mask[rows] & ~evicts_r
        least = min(bound, np.minimum.reduce(base_r[settle_r], initial=math.inf))
        near_r = base_r <= least
        if keep:
            near_r[rows.searchsorted(keep)] = True
        at = (evicts_r & near_r).nonzero()[0]
        return busy, self._price_at(model, rows[at], need_r[at])

    def _few_prices(self, model: str, size_mb: float, free_mb: np.ndarray, load: np.ndarray,
                    hidden: Any, avail_ms: np.ndarray, finish: np.ndarray,
                    mask: np.ndarray | None, keep: tuple[int, ...], rows: list[int],
                    bound: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`prices`' rows worked out in Python floats, the same IEEE operations in
        the same order (``np.minimum`` as :func:`cost._np_min`): past capacity most
        tasks have one or two such rows, where each numpy call on them cost more than
        its arithmetic."""
        n = len(self.arr)
        busy = np.zeros(n)
        least = bound
        scored: list[tuple[int, float, float, bool]] = []  # row, base, need, evicts
        loading: set[int] | None = None
        for i in rows:
            li, fi = float(load[i]), float(finish[i])
            b = 0.0
            if li > 0.0:
                a = float(avail_ms[i])
                if a > 0.0:  # busy_load_price's rule
                    paid = li if hidden is None else li - float(hidden[i])
                    b = busy[i] = paid * _np_min(a / BUSY_HORIZON_MS, 1.0) * BUSY_WEIGHT
            need = size_mb - float(free_mb[i])
            evicts = li > 0.0 and need > 0
            if evicts and self.arr.loading:
                if loading is None:
                    loading = {k for k, on in self.arr.loading.items() if model in on}
                evicts = i not in loading
            base = fi + b
            if not evicts and (mask is None or mask[i]) and base < least:
                least = base  # choice_price's bound: the least unpriced score
            scored.append((i, base, need, evicts))
        if not self.active:
            return busy, np.zeros(n)
        at = [(i, need) for i, base, need, evicts in scored
              if evicts and (base <= least or i in keep)]
        if not at:
            return busy, np.zeros(n)
        return busy, self._price_at(model, np.array([i for i, _ in at], dtype=np.intp),
                                    np.array([need for _, need in at], dtype=float))

    def _two_prices(self, model: str, size_mb: float, free_mb: np.ndarray, load: np.ndarray,
                    hidden: Any, avail_ms: np.ndarray, finish: np.ndarray,
                    mask: np.ndarray | None, keep: tuple[int, ...]
                    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`prices` by the two methods, each over every worker."""
        busy = self.busy_price(load, hidden, avail_ms, finish, mask, keep)
        return busy, self.choice_price(model, size_mb, free_mb, load, finish + busy, mask,
                                       keep)

    def _not_loading(self, model: str, rows: np.ndarray, evicts: np.ndarray) -> None:
        """``evicts`` (at ``rows``) false where a load of ``model`` is under way."""
        if not self.arr.loading:
            return
        at = [i for i, on in self.arr.loading.items() if model in on]
        if at:  # rows is sorted (nonzero's): each loading row's place, if it is there
            for k, i in zip(rows.searchsorted(at).tolist(), at, strict=True):
                if k < len(rows) and rows[k] == i:
                    evicts[k] = False

    def _evicts(self, model: str, need: np.ndarray, load: np.ndarray) -> np.ndarray:
        """Per worker: a load of ``model`` there evicts something (it needs memory that
        is not free, and no load of it is under way there already)."""
        evicts = (load > 0) & (need > 0)
        for i, on in self.arr.loading.items():
            if model in on:
                evicts[i] = False  # a load under way has its memory: it evicts nothing more
        return evicts

    def _price_rows(self, model: str, need: np.ndarray, evicts: np.ndarray) -> np.ndarray:
        """:meth:`price` at the rows ``evicts`` marks, 0 elsewhere."""
        rows = evicts.nonzero()[0]  # np.flatnonzero of a 1-D mask, without its wrappers
        return self._price_at(model, rows, need[rows])

    def _price_at(self, model: str, rows: np.ndarray, need: np.ndarray) -> np.ndarray:
        """:meth:`price` at ``rows`` (``need``: their MB to free), 0 elsewhere."""
        out = np.zeros(len(self.arr))
        if not len(rows):
            return out
        order, sizes, worth = self._order(self.arr.models[model])
        # rows first, then the columns in order: the same elements as one 2-D fancy
        # index (resident[rows[:, None], order]) at a third of its cost
        mb = self.resident[rows][:, order] * sizes  # 0 where not held
        before = np.add.accumulate(mb, axis=1)  # np.cumsum, without its wrapper
        before -= mb
        # a victim: held and needed; where not held, mb is 0 and adds nothing
        cost_mb = np.add.reduce((before < need[:, None]) * mb * worth, axis=1)
        out[rows] = cost_mb * self.arr.ms_per_mb[rows]
        return out

    def _order(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The models in the order a load of model ``j`` evicts them, and their sizes and
        worths in that order (``j``'s own worth 0: it is what is being loaded)."""
        orders = self._victims.orders
        got = orders.get(j)
        if got is None:
            tier, worth = self._victim_terms()
            worth = worth.copy()
            worth[j] = 0.0
            # victims: spare copies first (worth 0), then kept ones least likely needed
            # first (a batch plan's protected ones last); among equals the larger first
            order = np.lexsort((-self.sizes, worth, tier))
            got = orders[j] = (order, self.sizes[order], worth[order])
        return got

    def _victim_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """(tier, worth) of :meth:`_order`, per model, worked out once until a mark: for
        a batch plan ``tier()`` and ``worth()``; the protected tier and weight are left
        out when no copy is protected (the same order and worths, fewer passes)."""
        got = self._victims.ranks
        if got is None:
            kept = self.copies <= self.target
            tier, worth = kept, self.chance * np.where(kept, KEPT_WEIGHT, SPARE_WEIGHT)
            if self.batch:
                protected = kept & self.urgent
                if protected.any():
                    tier = kept.astype(float) + protected
                    worth = worth * np.where(protected, PROTECT_WEIGHT, 1.0)
            got = self._victims.ranks = (tier, worth)
        return got


def _finite(values: np.ndarray) -> bool:
    """Whether every value is finite (and below 1e154): their sum of squares is then a
    number below inf; a NaN or an infinity, of either sign, makes it NaN or inf. One
    BLAS dot, cheaper than a numpy reduction; too large a value only says no."""
    return float(np.dot(values, values)) < math.inf


def busy_load_price(load: np.ndarray, hidden: Any, avail_ms: np.ndarray,
                    rows: np.ndarray | None = None) -> np.ndarray:
    """ms of other jobs' time a load on each worker costs: the part of it not made while
    the task waits (``hidden``), times how busy the worker is (its queued work
    ``avail_ms`` over ``BUSY_HORIZON_MS``, at most 1), times ``BUSY_WEIGHT``.

    Earliest finish counts a load once, for the task that asks for it. On an idle worker
    that is all it costs; on a busy one the load's time comes out of the tasks queued
    behind it, and past capacity that is everyone's: edge-vision at twice its knee
    chased queue imbalances of a second or two with loads (2x the loads per job).
    ``hidden``: an array, a ``cost.Hidden`` or None (nothing hidden); never negative.
    ``rows`` (bool per worker, written over): work it out there only, 0 elsewhere
    (:meth:`EvictionPricer.busy_price`)."""
    out = np.zeros(len(load))
    # 0 where nothing loads or nothing waits (idle workers, the model resident): worked out
    # only at the other rows, a cost.Hidden read per row when they are few (light load)
    busy = (load > 0.0) if rows is None else rows
    busy &= avail_ms > 0.0
    count = int(np.count_nonzero(busy))
    if not count:
        return out
    if hidden is not None and not isinstance(hidden, np.ndarray) and count <= 32:
        rows = busy.nonzero()[0]
        paid = load[rows] - np.asarray([hidden[i] for i in rows.tolist()], dtype=float)
        out[rows] = paid * np.minimum(avail_ms[rows] / BUSY_HORIZON_MS, 1.0) * BUSY_WEIGHT
        return out
    # many rows (past capacity, most workers): the same operations over every row, kept
    # to the busy ones by ``where=`` (no gathers, no scatter; nothing else is computed)
    if hidden is None:
        np.copyto(out, load, where=busy)
    else:
        np.subtract(load, hidden if isinstance(hidden, np.ndarray) else hidden.array(),
                    out=out, where=busy)
    np.multiply(out, np.minimum(avail_ms / BUSY_HORIZON_MS, 1.0), out=out, where=busy)
    out *= BUSY_WEIGHT
    return out


class _Victims:
    """An :class:`EvictionPricer`'s victim orders, per model column: the order a load of
    it evicts the models in, with their sizes and worths in that order (``_order``), and
    the (tier, worth) they are sorted by (``_victim_terms``). They read only the terms
    and which copies are kept, so pricers of the same terms share one until a mark."""

    __slots__ = ("orders", "ranks")

    def __init__(self) -> None:
        self.orders: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.ranks: tuple[np.ndarray, np.ndarray] | None = None


#: sizes, targets, chances, copies, urgent; and whether the sizes and chances are
#: finite and not negative (``EvictionPricer.choice_price``)
Terms = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]
#: Memos keyed by the identity of what an entry depends on; each entry holds those
#: objects, so an id cannot be reused while its entry lives. The snapshot's terms are
#: worked out in parts, each memoised on its own deps: a simulated cluster's snapshots
#: share the capacity columns and, until a residency changes, the residency matrix,
#: while the demand is new each time.
_TERMS: dict[tuple[int, ...], tuple[tuple[object, ...], Any]] = {}
_STATIC: dict[tuple[int, ...], tuple[tuple[object, ...], Any]] = {}
_COPIES: dict[tuple[int, ...], tuple[tuple[object, ...], Any]] = {}
_VICTIMS: dict[tuple[int, ...], tuple[tuple[object, ...], Any]] = {}
#: The terms by their demand numbers (targets, chances, urgent flags); an entry is used
#: only with the very sizes and copies it holds (``_build_terms``).
_BY_VALUE: dict[tuple[tuple[Any, ...], ...], Terms] = {}
#: The last per-MB load time column checked by :func:`_rates_sound`, and the answer.
_RATES: list[tuple[np.ndarray, bool]] = []
_TERMS_KEPT = 8
#: At most this many rows to price: :meth:`EvictionPricer.prices` works them out in
#: Python floats (numpy's per-call cost is the larger below it).
_FEW_ROWS = 24
_TERMS_LOCK = threading.Lock()


def _memo(table: dict[tuple[int, ...], tuple[tuple[object, ...], Any]],
          deps: tuple[object, ...], build: Callable[[], Any]) -> Any:
    """``build()``, or what it gave last for these very ``deps`` (the last few kept)."""
    key = tuple(map(id, deps))
    hit = table.get(key)
    if hit is not None:  # a loop, not all() over a generator: this runs for every pricer
        for a, b in zip(hit[0], deps, strict=True):
            if a is not b:
                break
        else:
            return hit[1]
    value = build()
    with _TERMS_LOCK:  # routers plan on several threads
        if len(table) >= _TERMS_KEPT:
            table.pop(next(iter(table)), None)
        table[key] = (deps, value)
    return value


def _static_terms(arrays: WorkerArrays, sizes_mb: Mapping[str, float]
                  ) -> tuple[np.ndarray, dict[str, int], bool]:
    """Per model: its size, and how many workers it fits on (capacity only); and
    whether every size is finite and not negative."""
    sizes = np.zeros(len(arrays.models))
    for name, j in arrays.models.items():
        sizes[j] = float(sizes_mb.get(name, 0.0))
    sizes.flags.writeable = False
    fits = {name: int(arrays.fits(float(sizes[j])).sum()) for name, j in arrays.models.items()}
    return sizes, fits, bool(np.isfinite(sizes).all() and (sizes >= 0).all())


def _rates_sound(rates: np.ndarray) -> bool:
    """Whether every per-MB load time is finite and not negative (an eviction price is
    then a number at least 0); the last column's answer kept (a snapshot's is fixed)."""
    last = _RATES[0] if _RATES else None
    if last is not None and last[0] is rates:
        return last[1]
    sound = bool(np.isfinite(rates).all() and (rates >= 0).all())
    _RATES[:] = [(rates, sound)]
    return sound


def _copies(resident: np.ndarray) -> np.ndarray:
    """Per model: its resident copies."""
    copies = resident.sum(axis=0)
    copies.flags.writeable = False
    return copies


def _snapshot_terms(arrays: WorkerArrays, demand: Mapping[str, ModelDemand],
                    sizes_mb: Mapping[str, float]) -> Terms:
    """Per model: size, replica target, chance of being asked for within ``HORIZON_S``,
    resident copies, live deadline-bound demand (``URGENT_MIN_PER_S``). Read-only: a
    pricer copies before it changes anything."""
    deps = (arrays.resident, arrays.gpu_total_mb, arrays.models, demand, sizes_mb)
    return _memo(_TERMS, deps, lambda: _build_terms(arrays, demand, sizes_mb))


def _build_terms(arrays: WorkerArrays, demand: Mapping[str, ModelDemand],
                 sizes_mb: Mapping[str, float]) -> Terms:
    sizes, fits, sound = _memo(_STATIC, (arrays.gpu_total_mb, arrays.models, sizes_mb),
                               lambda: _static_terms(arrays, sizes_mb))
    m = len(arrays.models)
    # built as lists, then one array each: per model item writes into numpy arrays cost
    # more than the rest of this, which runs at every new clock of a simulated cluster
    target_l, chance_l, urgent_l = [0] * m, [0.0] * m, [False] * m
    if demand:
        models = arrays.models
        for name, d in demand.items():
            j = models.get(name)
            if j is None:
                continue
            target_l[j] = replica_target(d, fits.get(name)) or 0  # replica_targets' entry
            chance_l[j] = -math.expm1(-d.per_s * HORIZON_S)
            urgent_l[j] = d.urgent_per_s >= URGENT_MIN_PER_S
        copies = _memo(_COPIES, (arrays.resident,), lambda: _copies(arrays.resident))
    else:
        copies = np.zeros(m, dtype=int)
        copies.flags.writeable = False
    # The same numbers give the same terms object: the rates decay at every clock, but
    # the targets (whole numbers), the chances (1.0 for a model asked for a few times a
    # second) and the urgent flags mostly stay put, and the victim orders and the cache's
    # rank, memoised by the terms' identity, are then not worked out again
    key = (tuple(target_l), tuple(chance_l), tuple(urgent_l))
    hit = _BY_VALUE.get(key)
    if hit is not None and hit[0] is sizes and hit[3] is copies:
        return hit
    target = np.array(target_l, dtype=int)
    chance = np.array(chance_l, dtype=float)
    urgent = np.array(urgent_l, dtype=bool)
    target.flags.writeable = chance.flags.writeable = False  # shared between plans
    urgent.flags.writeable = False
    # -expm1(-x) is in [0, 1] for a rate x >= 0 (NaN for a NaN one): worths (a chance
    # times positive weights) are then finite and not negative
    sound = sound and all(0.0 <= c <= 1.0 for c in chance_l)
    terms = sizes, target, chance, copies, urgent, sound
    with _TERMS_LOCK:
        if len(_BY_VALUE) >= _TERMS_KEPT:
            _BY_VALUE.pop(next(iter(_BY_VALUE)), None)
        _BY_VALUE[key] = terms
    return terms


def eviction_rank(cluster: ClusterView) -> dict[str, tuple[float, float, float]]:
    """Model -> sort key of its copies as eviction victims, lowest first: spare before
    kept before protected (kept, and live deadline-bound demand needs it), then least
    worth per MB, then larger first. The order :class:`EvictionPricer` assumes for a
    batch load, for the worker's cache to follow (``CacheDecider.rank``); empty without
    demand. Memoised per (immutable) snapshot."""
    if not cluster.demand:
        return {}
    hit = _RANKS.get(id(cluster))
    if hit is not None and hit[0]() is cluster:
        return hit[1]
    arrays, demand, sizes = worker_arrays(cluster), cluster.demand, cluster.model_sizes_mb
    # the same terms give the same rank: a new snapshot at the same clock and residency
    # (most snapshots differ by backlogs) reuses it
    terms = _snapshot_terms(arrays, demand, sizes)
    rank = _memo(_RANK_TERMS, (terms, arrays.models), lambda: _rank_of(terms, arrays.models))
    key = id(cluster)
    _RANKS[key] = (weakref.ref(cluster, lambda _: _RANKS.pop(key, None)), rank)
    return rank


_RANKS: dict[int, tuple[weakref.ref[ClusterView], dict[str, tuple[float, float, float]]]] = {}
_RANK_TERMS: dict[tuple[int, ...], tuple[tuple[object, ...], Any]] = {}


def _rank_of(terms: Terms, models: Mapping[str, int]) -> dict[str, tuple[float, float, float]]:
    """:func:`_rank` of a pricer of ``terms`` (no plan marked on it), in Python floats:
    the same numbers (tier 0/1/2, the chance times one weight, the size negated) with
    no pricer built and no pass over numpy arrays of ten models at every new clock."""
    sizes, target, chance, copies, urgent, _ = terms
    size, want, p, have, hot = (sizes.tolist(), target.tolist(), chance.tolist(),
                                copies.tolist(), urgent.tolist())
    out: dict[str, tuple[float, float, float]] = {}
    for m, j in models.items():
        kept = have[j] <= want[j]
        out[m] = (float(kept) + float(kept and hot[j]),
                  p[j] * (KEPT_WEIGHT if kept else SPARE_WEIGHT), -size[j])
    return out


def _rank(pricer: EvictionPricer) -> dict[str, tuple[float, float, float]]:
    """:func:`eviction_rank` from a pricer of the snapshot (no plan marked on it)."""
    tier, worth = pricer.tier(), pricer.worth()
    return {m: (float(tier[j]), float(worth[j]), -float(pricer.sizes[j]))
            for m, j in pricer.arr.models.items()}

