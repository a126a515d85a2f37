"""A producer's own decisions, folded into the snapshot it plans on.

Between two reads of the workers' records a producer plans on the last one it read. Its
own decisions since are not in those records yet, so it folds them in as it makes them,
until a fresher record of the worker replaces the row: the router into its reader's
snapshot (``state.reader``), the simulator into its stale snapshot (``--refresh-ms``),
both with these rules.

* :func:`charged` is a backlog charge: without it, every task of a burst would see the
  same backlog and pile onto the worker that looked idle.
* :func:`planned_load` is a planned model load. A plan that loads model M on worker W is
  not in W's record until W starts the load, so a second plan on the same snapshot sees
  M nowhere: it places its own load elsewhere (a second copy of M, evicting a model
  another job needs), or counts the memory M will take on W as free. Folded, W shows M
  loading (``WorkerView.loading``, ending by the task's planned start) with its memory
  taken, and the models the worker's cache would evict to make room gone. The victims
  are taken in the order the cache follows (``CacheDecider.rank``, from
  :func:`~compass_celery.planner.evict.eviction_rank`): lowest rank first, then by
  name. The producer does not know the worker's queue or its recency, so this is the
  cache's choice among models no queued task needs; a load that cannot make room
  (nothing resident to evict) folds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .cost import evolve
from .types import ClusterView, Placement, TaskSpec, WorkerView

#: A model with no rank (no demand known) sorts as the lowest tier, as the cache does.
_NO_RANK = (0.0, 0.0, 0.0)


Rank = Mapping[str, tuple[float, ...]]


def planned_load(worker: WorkerView, model: str, sizes: Mapping[str, float], now: float,
                 ends: float, rank: Rank | Callable[[], Rank] | None = None
                 ) -> WorkerView:
    """``worker`` once a planned load of ``model`` (``sizes``: MB by model) is under way: loading
    from ``now`` to ``ends``, its memory taken, and what the cache would evict for it
    (``rank``: ``eviction_rank``'s order, or what returns it, asked only when something
    must go) gone. ``worker`` itself when ``model`` is
    resident or loading there already, or no room can be made."""
    if model in worker.resident or model in worker.loading:
        return worker
    size_mb = sizes.get(model, 0.0)
    free = worker.gpu_free_mb
    gone: list[str] = []
    if free < size_mb:
        order = (rank() if callable(rank) else rank) or {}
        victims = sorted(worker.resident, key=lambda m: (order.get(m, _NO_RANK), m))
        for victim in victims:
            if free >= size_mb:
                break
            gone.append(victim)
            free += sizes.get(victim, 0.0)
        if free < size_mb:
            return worker
    return evolve(worker, resident=worker.resident.difference(gone) if gone else worker.resident,
                  gpu_free_mb=free - size_mb,
                  loading={**worker.loading, model: (now, max(ends, now))})


def fold_planned(workers: tuple[WorkerView, ...], planned: Mapping[str, Mapping[str, float]],
                 sizes: Mapping[str, float], now: float,
                 rank: Rank | Callable[[], Rank] | None = None) -> tuple[WorkerView, ...]:
    """``workers`` with every producer's planned loads (``planned``: worker -> model ->
    when the model is to be in, on the clock of ``now``) folded in by
    :func:`planned_load`, those not over at ``now``, each worker's in the order they end:
    what one producer folds of its own loads, the others read from the store. A load
    is taken to run its whole time there (size over the worker's load rate) up to its
    end, so what is left of it is never more than the time to its end. ``workers``
    itself when nothing changes (the load is in the worker's record, or none is
    planned)."""
    if not planned:
        return workers
    out = list(workers)
    changed = False
    for i, w in enumerate(workers):
        loads = planned.get(w.name)
        if not loads:
            continue
        for model, ends in sorted(loads.items(), key=lambda kv: (kv[1], kv[0])):
            size = sizes.get(model)
            if ends < now or size is None:
                continue
            rate = w.host_load_mb_per_s if model in w.host_resident else w.load_mb_per_s
            began = min(now, ends - size / rate) if rate > 0 else now
            out[i] = planned_load(out[i], model, sizes, began, ends, rank)
        changed = changed or out[i] is not w
    return tuple(out) if changed else workers


def charged(w: WorkerView, ms: float, pending: bool = False,
            level: int | None = None, total: bool = True) -> WorkerView:
    """``w`` with ``ms`` added to its backlog (``pending``: its planned-but-unsent work;
    ``level``: its queued (or planned) work of that priority, and the total unless
    ``total`` is off), never below zero, as reads of the store's counters clamp them:
    a producer's own charge, folded into its snapshot until a fresher record has it."""
    total_field, by_level = ("pending_ms", "pending_queued_ms") if pending \
        else ("backlog_ms", "queued_ms")
    changes: dict[str, Any] = \
        {total_field: max(0.0, getattr(w, total_field) + ms)} if total else {}
    if level is not None:
        queued = dict(getattr(w, by_level))
        queued[level] = max(0.0, queued.get(level, 0.0) + ms)
        changes[by_level] = queued
    return evolve(w, **changes)


def load_span(now: float, finish_ms: float, run_ms: float, clock_ms: float = 1.0
              ) -> tuple[float, float]:
    """The span a planned load is folded in for, on the view's clock (``clock_ms`` ms per
    unit: 1 in the simulator, 1000 on a wall clock in seconds): from ``now`` until the
    model is planned to be in (the task's planned finish, ms from now, less its run)."""
    return now, now + max(finish_ms - run_ms, 0.0) / clock_ms


def fold_plan(cluster: ClusterView, tasks: Mapping[str, TaskSpec],
              placements: Mapping[str, Placement],
              rank: Mapping[str, tuple[float, ...]] | None = None,
              charges: Mapping[str, tuple[float, bool, int | None]] | None = None
              ) -> dict[int, WorkerView]:
    """The rows of ``cluster`` a plan changes (position -> the worker as it leaves it):
    each placed task's model load where the model is neither resident nor loading
    (:func:`planned_load`, until its :func:`load_span` ends), and with ``charges`` (node
    -> (ms, pending, level)) each task's charge (:func:`charged`). Empty: the plan
    changes nothing there (or every task went to the shared queue)."""
    rows: dict[int, WorkerView] = {}
    index = {w.name: i for i, w in enumerate(cluster.workers)}
    sizes, now = cluster.model_sizes_mb, cluster.now
    for node, placed in placements.items():
        i = index.get(placed.worker)
        if i is None:
            continue
        worker = after = rows.get(i, cluster.workers[i])
        spec = tasks.get(node)
        if spec is not None and spec.model is not None:
            after = planned_load(after, spec.model, sizes,
                                 *load_span(now, placed.finish_ms, placed.run_ms), rank)
        if charges and node in charges:
            ms, pending, level = charges[node]
            after = charged(after, ms, pending, level)
        if after is not worker:
            rows[i] = after
    return rows
