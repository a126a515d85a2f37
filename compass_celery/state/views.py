"""The planner's view of a snapshot, carried over from the last one this process built.

Between the snapshot reader (what Redis says) and the planner (a
:class:`~compass_celery.planner.types.ClusterView` with its numpy columns): building
that view afresh at 1,000 workers costs more than the rest of a decision, so it is
rebuilt only for the workers that changed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from itertools import compress, count
from operator import is_not

from ..needs import learned_loads
from ..planner.cost import evolve, remember_arrays, with_rows, worker_arrays
from ..planner.demand import DemandSum
from ..planner.types import ClusterView, WorkerView
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
