"""The planner's view of a snapshot, carried over from the last one this process built.

Between the snapshot reader (what Redis says) and the planner (a
:class:`~compass_celery.planner.types.ClusterView` with its numpy columns): building
that view afresh at 1,000 workers costs more than the rest of a decision, so it is
rebuilt only for the workers that changed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import compress, count
from operator import is_not

from ..needs import learned_loads
from ..planner.cost import evolve, remember_arrays, with_rows, worker_arrays
from ..planner.demand import DemandSum, merge_demand
from ..planner.evict import eviction_rank
from ..planner.fold import fold_planned
from ..planner.priority import LOWEST, for_priority, seen_at, typical_run_ms, waits_below
from ..planner.types import ClusterView, ModelDemand, WorkerView
from .store import Snapshot

#: A view is carried over while at most this many workers (or a quarter) changed.
CARRY_MAX_CHANGED = 16


class ViewCache:
    """The last cluster view this process planned on, and its columns.

    A burst of decisions on one snapshot changes nothing but this process's own
    backlog charges (``SnapshotReader.note_charge`` replaces one worker's view each
    time); a fresh snapshot keeps the views of the workers that did not change. So
    the next view is the last one with the changed workers' rows rewritten, instead
    of a pass over every worker: at 1,000 workers that pass costs more than the rest
    of a decision. The view's ``needs`` (the sum of the workers' ``served``) is
    carried the same way: only a changed row whose ``served`` changed touches it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[tuple[WorkerView, ...], dict[str, float], ClusterView,
                          DemandSum] | None = None
        self.carried = self.built = 0

    def get(self, workers: tuple[WorkerView, ...], model_sizes_mb: Mapping[str, float],
            now: float, load_ms: Mapping[str, float] | None = None) -> ClusterView:
        """A view of ``workers`` equal to ``ClusterView.of(workers, model_sizes_mb, now,
        demand=cluster_demand(workers), load_ms=load_ms)`` (the demand up to float
        rounding). A change of learned load times (after a load) builds afresh."""
        with self._lock:
            last = self._last
        carried = None
        if last is not None and last[2].load_ms == (load_ms or {}):
            carried = self._carry(last, workers, model_sizes_mb, now)
        if carried is None:
            sums = DemandSum(workers)
            view = ClusterView.of(workers, model_sizes_mb, now, demand=sums.demand,
                                  load_ms=load_ms)
            self.built += 1
        else:
            view, sums = carried
            self.carried += 1
        with self._lock:
            self._last = (workers, dict(model_sizes_mb), view, sums)
        return view

    @staticmethod
    def _carry(last: tuple[tuple[WorkerView, ...], dict[str, float], ClusterView, DemandSum],
               workers: tuple[WorkerView, ...], sizes: Mapping[str, float], now: float
               ) -> tuple[ClusterView, DemandSum] | None:
        old_workers, old_sizes, old_view, sums = last
        if sizes != old_sizes or len(workers) != len(old_workers):
            return None
        if workers is old_workers:
            if old_view.now == now:
                return old_view, sums
            view = replace(old_view, now=now)
            remember_arrays(view, worker_arrays(old_view))
            return view, sums
        # positions whose view object changed, compared at C speed (a Python loop over a
        # thousand workers cost more than the rest of a decision)
        changed = list(compress(count(), map(is_not, old_workers, workers)))
        if len(changed) > max(CARRY_MAX_CHANGED, len(workers) // 4):
            return None
        arrays = worker_arrays(old_view)
        rows: dict[int, WorkerView] = {}
        for i in changed:
            j = arrays.index.get(workers[i].name)
            if j is None or j in rows:
                return None  # a worker came or went: build afresh
            rows[j] = workers[i]
        ordered = list(old_view.workers)
        before = {j: ordered[j] for j in rows}
        for j, w in rows.items():
            ordered[j] = w
        new_sums = sums.replaced((before[j], w) for j, w in rows.items())
        demand = old_view.demand if new_sums is sums else new_sums.demand  # same: shared
        view = evolve(old_view, workers=tuple(ordered), now=now, demand=demand)
        remember_arrays(view, with_rows(arrays, rows, before))
        return view, new_sums


_VIEWS = ViewCache()

#: The profiles table the learned load times were last read from, and what they were: a
#: snapshot's table is never changed once handed out (a read makes a new one, a charge
#: keeps it), and a burst's decisions each plan on the same one.
_LOADS: tuple[Mapping[str, float] | None, dict[str, float]] = (None, {})


def snapshot_loads(profiles: Mapping[str, float]) -> dict[str, float]:
    """``needs.learned_loads(profiles)``, read again only for a table not read last time
    (a pass over every learned run time, on every decision, otherwise)."""
    global _LOADS
    last, loads = _LOADS
    if last is not profiles:
        loads = learned_loads(profiles)
        _LOADS = (profiles, loads)
    return loads


def cluster_view(snapshot: Snapshot, model_sizes_mb: Mapping[str, float]) -> ClusterView:
    """The planner's view of ``snapshot``, with the cluster's demand (the sum of the live
    workers' ``served``), carried over from the last one this process built."""
    return _VIEWS.get(snapshot.workers, model_sizes_mb, snapshot.taken_at,
                      snapshot_loads(snapshot.profiles))


def with_planned_loads(snapshot: Snapshot, model_sizes_mb: Mapping[str, float]) -> Snapshot:
    """``snapshot`` with every producer's planned loads folded into its workers' views
    (``planner.fold.fold_planned``, the rule a producer folds its own by), the victims
    ranked as the workers' caches rank them: a load planned by another producer is seen
    before its worker starts it, so a plan neither loads the model a second time
    elsewhere nor counts the memory it will take as free."""
    if not snapshot.planned_loads:
        return snapshot
    workers = fold_planned(snapshot.workers, snapshot.planned_loads, model_sizes_mb,
                           snapshot.taken_at,
                           lambda: eviction_rank(cluster_view(snapshot, model_sizes_mb)))
    return snapshot if workers is snapshot.workers else replace(snapshot, workers=workers)


def level_view(view: ClusterView, base: tuple[WorkerView, ...],
               level: tuple[WorkerView, ...]) -> ClusterView:
    """``view`` (the planner's view of ``base``) as a task of a priority level sees the
    workers: ``level`` is ``planner.priority.for_priority(base, ...)``, the same workers in
    the same order with only their backlog and planned work changed, so only the rows
    whose numbers changed are rewritten (``with_rows``; the served demand is the same).
    Planning on ``cluster_view`` of ``level`` itself built a new view of every worker at
    each such decision, and left the cache holding it, so the next decision at the
    lowest level built one again."""
    arrays = worker_arrays(view)
    ordered = list(view.workers)
    rows: dict[int, WorkerView] = {}
    before: dict[int, WorkerView] = {}
    for w, was in zip(level, base, strict=True):
        if w is not was and (w.backlog_ms != was.backlog_ms or w.pending_ms != was.pending_ms):
            j = arrays.index[w.name]
            rows[j], before[j], ordered[j] = w, ordered[j], w
    if not rows:
        return view
    new = evolve(view, workers=tuple(ordered))
    remember_arrays(new, with_rows(arrays, rows, before))
    return new


@dataclass(frozen=True)
class _Leveled:
    """What :class:`LevelCache` keeps of one level: the snapshot's workers it saw (in the
    snapshot's order), each as the level sees it, the positions with work waiting below
    the level, the base view and the view it gave, and the race's clock and typical run."""

    base: tuple[WorkerView, ...]
    seen: tuple[WorkerView, ...]
    lower: frozenset[int]
    cluster: ClusterView
    view: ClusterView
    now: float | None
    typical: float


class LevelCache:
    """The planner's view as a task of each priority level sees it (``for_priority``, then
    :func:`level_view`), carried over from the last one of that level.

    Above the lowest level, while lower-level work waits anywhere, ``for_priority`` makes
    a new view of every worker at each decision, and at 64 workers that cost six times
    the rest of the decision. A burst's decisions change one worker each (their own
    charge), so only the rows whose snapshot view changed are seen again
    (``planner.priority.seen_at``, the same rule) and rewritten in the columns.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, _Leveled] = {}
        self.carried = self.built = 0

    def get(self, cluster: ClusterView, workers: tuple[WorkerView, ...], level: int | None,
            now: float | None) -> ClusterView:
        """``cluster`` (the view of ``workers``, a snapshot's) as a task of ``level`` sees it,
        equal to ``level_view(cluster, workers, for_priority(workers, level, now))`` (the
        cluster itself when that leaves every row as it was)."""
        if level is None or level <= LOWEST:
            return cluster
        with self._lock:
            last = self._last.get(level)
        entry = self._carry(last, cluster, workers, level, now) if last is not None else None
        if entry is None:
            seen = for_priority(workers, level, now)
            view = cluster if seen is workers else level_view(cluster, workers, seen)
            lower = frozenset(i for i, w in enumerate(workers) if waits_below(w, level))
            typical = typical_run_ms(workers) if now is not None else 0.0
            entry = _Leveled(workers, seen, lower, cluster, view, now, typical)
            self.built += 1
        else:
            self.carried += 1
        with self._lock:
            self._last[level] = entry
        return entry.view

    @staticmethod
    def _carry(last: _Leveled, cluster: ClusterView, workers: tuple[WorkerView, ...],
               level: int, now: float | None) -> _Leveled | None:
        """The next entry from ``last`` for the rows that changed; None to build afresh."""
        old = last.base
        if (last.now != now or len(workers) != len(old) or not last.lower
                or cluster.model_sizes_mb != last.cluster.model_sizes_mb
                or cluster.load_ms != last.cluster.load_ms
                or len(cluster.workers) != len(workers)):
            return None
        changed = list(compress(count(), map(is_not, old, workers)))
        if len(changed) > max(CARRY_MAX_CHANGED, len(workers) // 4):
            return None
        lower = set(last.lower)
        for i in changed:
            w, was = workers[i], old[i]
            if w.name != was.name or (now is not None and w.running is not was.running
                                      and w.running != was.running):
                return None  # a worker came or went, or the typical run may differ
            if waits_below(w, level):
                lower.add(i)
            else:
                lower.discard(i)
        if not lower:  # nothing waits below the level any more: every row as it is
            return _Leveled(workers, workers, frozenset(), cluster, cluster, now, 0.0)
        arrays = worker_arrays(last.view)
        ordered = list(last.view.workers)
        seen = list(last.seen)
        rows: dict[int, WorkerView] = {}
        before: dict[int, WorkerView] = {}
        for i in changed:
            w = seen[i] = seen_at(workers[i], level, now, last.typical)
            if w.backlog_ms == workers[i].backlog_ms and w.pending_ms == workers[i].pending_ms:
                w = workers[i]  # as level_view: a row the level sees as it is stays
            j = arrays.index[w.name]
            if ordered[j] is not w:
                rows[j], before[j], ordered[j] = w, ordered[j], w
        view = evolve(cluster, workers=tuple(ordered))
        remember_arrays(view, with_rows(arrays, rows, before))
        return _Leveled(workers, tuple(seen), frozenset(lower), cluster, view, now,
                        last.typical)


_LEVELS = LevelCache()


def leveled_view(cluster: ClusterView, workers: tuple[WorkerView, ...], level: int | None,
                 now: float | None) -> ClusterView:
    """``cluster`` (the planner's view of the snapshot's ``workers``) as a task of
    ``level`` sees them, racing on ``now`` (``planner.priority.race_clock``), carried over
    from the last decision at that level (:class:`LevelCache`)."""
    return _LEVELS.get(cluster, workers, level, now)


def planning_view(snapshot: Snapshot, model_sizes_mb: Mapping[str, float], level: int | None,
                  now: float | None, refused: Mapping[str, ModelDemand] | None = None
                  ) -> ClusterView:
    """What a task or a job of ``level`` is planned on: the snapshot's view as that level
    sees it (``now``: the race's clock, ``planner.priority.race_clock``), with the demand
    this process ``refused`` added to what the workers served; both views carried over
    from the last decision, so neither a routed task nor a submitted job builds one."""
    cluster = leveled_view(cluster_view(snapshot, model_sizes_mb), snapshot.workers, level,
                           now)
    if refused:
        arrays = worker_arrays(cluster)
        cluster = evolve(cluster, demand=merge_demand(cluster.demand, refused))
        remember_arrays(cluster, arrays)
    return cluster
