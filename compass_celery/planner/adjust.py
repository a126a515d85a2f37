"""Adjustment phase: when a task's inputs are ready, re-check its planned worker.

Runs on the worker that finished the last predecessor, against a fresher snapshot than
the one the job was planned on. Following the Compass authors, a task moves only when
its planned worker's backlog exceeds ``factor`` times the task's run time there (the
plan has gone stale), and then only to a worker whose estimated finish is better by
more than ``min_gain_ms``. Inputs are ready now (time 0 of the snapshot).

:func:`choose_successor` is the whole decision, made the same way by the worker runtime
(``job_runtime``) and the simulator; :func:`reassign` is its costed part.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from .choose import candidates, check_task, choose
from .cost import (
    WorkerArrays,
    backlog_left_ms,
    finish_ms,
    load_terms,
    run_ms,
    start_ms,
    worker_arrays,
)
from .evict import EvictionPricer
from .types import ClusterView, Placement, PlanningError, TaskSpec, WorkerView

# The authors' rule: a successor moves when its worker's backlog exceeds 1.5x its run time.
# The ``compass_move_factor`` setting and the simulator default to this.
DEFAULT_MOVE_FACTOR = 1.5


def plan_still_holds(backlog_ms: float, run_ms: float, factor: float) -> bool:
    """The authors' first rule: a backlog within ``factor`` x the run time keeps the plan."""
    return backlog_ms <= factor * run_ms


def choose_successor(
    task: TaskSpec,
    planned_worker: str,
    cluster: ClusterView | Callable[[], ClusterView],
    inputs_kb_by_worker: Mapping[str, float],
    *,
    factor: float,
    is_join: bool,
    adjusts: bool,
    planned: WorkerView | None = None,
    now: float = 0.0,
) -> Placement | None:
    """Where a released successor runs: a new placement, or None to keep its planned worker.

    The one adjustment decision the worker runtime and the simulator share. Nothing moves
    under a policy that does not adjust, nor when the snapshot has no live worker to move
    to. A planned worker that is not in the snapshot (gone, or ``""``/the shared queue
    when the job was planned without state) is always replaced, as in :func:`reassign`.
    ``cluster`` may be a callable that builds the snapshot: with ``planned`` (the planned
    worker's own current record, when the caller holds it without a snapshot, as the
    simulator does) a plan that :func:`plan_still_holds` is kept without building one,
    which is what happens to most successors. ``now`` is the time on the clock of its
    record's running tasks (what of them has run is not ahead: ``backlog_left_ms``).
    """
    if not adjusts:
        return None
    if planned is not None and planned.name == planned_worker and plan_still_holds(
            backlog_left_ms(planned, now), task.exec_ms / planned.speed, factor):
        return None  # reassign keeps it too; skip the snapshot and the costing
    view = cluster() if callable(cluster) else cluster
    if not view.workers:
        return None  # no live worker to move to: keep the plan
    return reassign(task, planned_worker, view, inputs_kb_by_worker, factor=factor,
                    is_join=is_join)


def reassign(
    task: TaskSpec,
    planned_worker: str,
    cluster: ClusterView,
    inputs_kb_by_worker: Mapping[str, float],
    *,
    factor: float = DEFAULT_MOVE_FACTOR,
    is_join: bool = False,
    min_gain_ms: float = 0.0,
) -> Placement | None:
    """A better placement for ``task``, or None to keep the planned worker.

    ``inputs_kb_by_worker`` says where the task's inputs are (worker name -> KB).
    Worker availability is the published backlog only: pending work may already
    include this very task on its planned worker, and counting it would push every
    task away from its plan. A planned worker that is gone (not in the snapshot) or
    cannot hold the model is always replaced.

    Joins (several inputs, usually on several workers) move only when the gain also
    exceeds the extra transfer the move causes (transfer at the new worker minus at the
    planned one). That transfer is already inside both finish estimates, so this counts
    it twice on purpose: bandwidth estimates are the least reliable term, a moved join
    pulls every input, and a join left in place keeps its collocated inputs in memory.

    With demand in the snapshot, workers are compared on finish plus the price of what a
    load there would evict (``planner.evict``), as compass plans: a move that gains a few
    ms now by pushing a busy model out is not worth the reload it causes later; a load
    on a busy worker counts once more (``evict.busy_load_price``).
    """
    size = check_task(task, cluster)
    if not cluster.workers:
        raise PlanningError(f"no live workers to re-place task {task.name!r} on")
    arr = worker_arrays(cluster)
    mask = candidates(arr, task, size)
    transfer = _transfer_ms(arr, inputs_kb_by_worker)
    avail = arr.backlog_left_ms(cluster.now)
    start = start_ms(avail, transfer, arr.hop_ms)
    load, hidden = _load(task, arr, size, transfer, start, cluster)
    run = run_ms(task.exec_ms, arr.speed)
    finish = finish_ms(start, load, run)
    score = finish
    p = arr.index.get(planned_worker)
    restrict = None if np.count_nonzero(mask) == len(mask) else mask  # None: all fit
    if cluster.demand and task.model is not None:
        pricer = EvictionPricer(arr, cluster.demand, cluster.model_sizes_mb)
        # a load on a busy worker costs the work queued behind it too (busy_load_price):
        # part of the score the eviction price is added to, so pricing only where the
        # choice can fall still holds (both terms are never negative)
        keep = () if p is None else (p,)
        busy, price = pricer.prices(task.model, size, arr.gpu_free_mb, load, hidden, avail,
                                    finish, restrict, keep)
        score = finish + busy + price
    best = choose(score, avail, restrict)
    if p is None or not mask[p]:
        why = f"planned worker {planned_worker!r} " + ("is gone" if p is None else "cannot hold it")
    else:
        if plan_still_holds(avail[p], run[p], factor) or best == p:
            return None
        gain = float(score[p] - score[best])
        need = min_gain_ms + (max(float(transfer[best] - transfer[p]), 0.0) if is_join else 0.0)
        if gain <= need:
            return None
        why = (
            f"{planned_worker} backlog {float(avail[p]):.0f}ms > {factor:g}x run "
            f"{float(run[p]):.0f}ms; finish {float(finish[best]):.0f}ms vs {float(finish[p]):.0f}ms"
        )
    return Placement(
        task=task.name,
        worker=arr.names[best],
        queue=arr.queues[best],
        start_ms=float(start[best]),
        finish_ms=float(finish_ms(start[best], load[best] - hidden[best], run[best])),
        wait_ms=float(start[best] - transfer[best]),
        load_ms=float(load[best] - hidden[best]),
        transfer_ms=float(transfer[best]),
        run_ms=float(run[best]),
        reason=f"moved: {why}",
        prefetch_ms=float(hidden[best]),
        hop_ms=float(arr.hop_ms[best]),
    )


def _transfer_ms(arr: WorkerArrays, inputs_kb_by_worker: Mapping[str, float]) -> np.ndarray:
    """Per worker: ms to pull the inputs it does not hold already."""
    total = sum(inputs_kb_by_worker.values())
    kb = np.full(len(arr), float(total))
    for name, here in inputs_kb_by_worker.items():
        i = arr.index.get(name)
        if i is not None:
            kb[i] = total - here
    return kb * arr.ms_per_kb


def _load(task: TaskSpec, arr: WorkerArrays, size: float, ready: np.ndarray,
          start: np.ndarray, cluster: ClusterView) -> tuple[np.ndarray, np.ndarray]:
    """Per worker: the task's model load (ms) and the part of it made while it waits,
    behind the loads under way there (one loader per worker, as a plan counts it)."""
    if task.model is None:
        zeros = np.zeros(len(arr))
        return zeros, zeros
    sizes, now = cluster.model_sizes_mb, cluster.now
    loader = arr.loads_ahead(sizes, now)[0] if arr.loading else 0.0
    return load_terms(arr.load_columns(task.model, size), size, arr.gpu_free_mb, ready, start,
                      loader, in_flight=arr.queued_flight(task.model, size, sizes, now))
