"""A deliberately static replica placement: the simulator's reference for compass's replicas.

Compass keeps busy models resident by pricing evictions against recent demand
(``planner.demand``, ``planner.evict``), replica by replica as the run goes. This module
does the same job once, before the run, with everything known in advance:

1. :func:`expected_demand`: per model, the GPU time (ms per second) and tasks per second
   the workload will ask for: the arrival rate x each workflow's share of the mix x its
   tasks' ``exec_ms`` (nominal rate: for bursty arrivals, the rate while jobs arrive);
2. :func:`assign_replicas`: replica counts from :func:`~.demand.replica_targets` (capped
   by how many workers' GPUs can hold the model), then a greedy bin-packing onto the
   workers' GPU memory: replicas are placed in rounds (every model's first replica, then
   every second one, ...), within a round the largest demand per MB first, each on the
   worker with the most free memory that does not hold that model yet (ties: worker
   name). A replica that fits nowhere is dropped and counted in ``missing``;
3. :class:`StaticReplicaPolicy`: each task goes to its earliest-finish worker among those
   holding its model, with the planner's own cost model (``planner.walk``); a task whose
   model has no replica goes to the earliest finish anywhere it can be loaded beside the
   pinned models, and a task without a model to the earliest finish anywhere.

The assigned models are loaded before the first job and never evicted (the simulator pins
them in each worker's cache). It is a simulator-only reference: the real runtime cannot
build it (it needs the assignment, and nothing there loads or pins models up front), so it
is not in ``planner.POLICIES``; ``compass_celery.sim`` builds it per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .choose import choose
from .demand import REPLICA_BUSY, replica_targets
from .types import ClusterView, DagSpec, ModelDemand, Placement, Plan, PlanningError
from .walk import Estimate, Walk

#: The policy's name in the simulator's ``--policies`` and results.
NAME = "static-replicas"


def expected_demand(dags: Mapping[str, DagSpec], mix: Mapping[str, float],
                    rate_per_s: float) -> dict[str, ModelDemand]:
    """Per model, what ``rate_per_s`` jobs drawn by ``mix`` (weights over ``dags``'
    names, normalised here) ask for: GPU ms per second and tasks per second."""
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise PlanningError(f"rate_per_s must be finite and > 0, got {rate_per_s!r}")
    total = sum(mix.values())
    if not (math.isfinite(total) and total > 0) or any(w < 0 for w in mix.values()):
        raise PlanningError(f"mix weights must be >= 0 with a positive sum, got {dict(mix)}")
    ms: dict[str, float] = {}
    n: dict[str, float] = {}
    for dag_name, weight in mix.items():
        dag = dags.get(dag_name)
        if dag is None:
            raise PlanningError(f"mix names unknown DAG {dag_name!r}")
        jobs_per_s = rate_per_s * weight / total
        for task in dag.nodes.values():
            if task.model is None:
                continue
            ms[task.model] = ms.get(task.model, 0.0) + jobs_per_s * task.exec_ms
            n[task.model] = n.get(task.model, 0.0) + jobs_per_s
    return {m: ModelDemand(ms[m], n[m]) for m in sorted(ms)}


@dataclass(frozen=True)
class ReplicaAssignment:
    """Which workers hold which models for a whole run.

    ``holders``: model -> workers, in the order they were placed; ``targets``: the
    replicas each model should have (``replica_targets``, capped by the workers its size
    fits on); ``missing``: model -> replicas of its target that did not fit in memory
    (empty when every target was met).
    """

    holders: Mapping[str, tuple[str, ...]]
    targets: Mapping[str, int]
    missing: Mapping[str, int]

    def by_worker(self) -> dict[str, tuple[str, ...]]:
        """Worker -> the models assigned to it (the ones to preload and pin)."""
        out: dict[str, list[str]] = {}
        for model, workers in self.holders.items():
            for w in workers:
                out.setdefault(w, []).append(model)
        return {w: tuple(ms) for w, ms in sorted(out.items())}

    def report(self) -> dict[str, Any]:
        """The assignment for a result record: model -> workers, targets, shortfalls."""
        return {"assignment": {m: list(ws) for m, ws in self.holders.items()},
                "replica_targets": dict(self.targets),
                "replicas_missing": dict(self.missing)}


def assign_replicas(demand: Mapping[str, ModelDemand], sizes_mb: Mapping[str, float],
                    gpu_mb: Mapping[str, float], busy: float = REPLICA_BUSY
                    ) -> ReplicaAssignment:
    """Replica counts from ``demand`` and a greedy placement onto ``gpu_mb`` (worker ->
    GPU MB) that never exceeds a worker's memory (see the module docstring)."""
    for model in demand:
        size = sizes_mb.get(model)
        if size is None or not (math.isfinite(size) and size >= 0):
            raise PlanningError(f"model {model!r} has no valid size (got {size!r})")
    fits = {m: sum(1 for cap in gpu_mb.values() if cap >= sizes_mb[m]) for m in demand}
    targets = replica_targets(demand, fits, busy)

    def per_mb(m: str) -> float:
        size = sizes_mb[m]
        return demand[m].ms_per_s / size if size > 0 else math.inf

    order = sorted(targets, key=lambda m: (-per_mb(m), m))
    workers = sorted(gpu_mb)
    free = {w: float(gpu_mb[w]) for w in workers}
    held: dict[str, list[str]] = {m: [] for m in order}
    for k in range(max(targets.values(), default=0)):
        for m in order:
            if targets[m] <= k or len(held[m]) < k:  # done, or an earlier replica missed
                continue
            size = float(sizes_mb[m])
            best: str | None = None
            for w in workers:
                if free[w] >= size and w not in held[m] and (best is None or free[w] > free[best]):
                    best = w
            if best is not None:
                held[m].append(best)
                free[best] -= size
    holders = {m: tuple(held[m]) for m in order if held[m]}
    missing = {m: targets[m] - len(held[m]) for m in order if len(held[m]) < targets[m]}
    return ReplicaAssignment(holders, dict(targets), missing)


class StaticReplicaPolicy:
    """Earliest finish among the workers a fixed assignment gives the task's model.

    Simulator-only reference (see the module docstring): ``assignment`` is a
    :class:`ReplicaAssignment` or a plain model -> workers mapping; ``sizes_mb`` is not
    needed, the snapshot's catalogue is used. It does not adjust (a released successor
    stays on its planned holder, where its model is pinned).
    """

    name = NAME
    adjusts = False
    shared = False

    def __init__(self, assignment: ReplicaAssignment | Mapping[str, Sequence[str]],
                 count_pending: bool = True) -> None:
        holders = assignment.holders if isinstance(assignment, ReplicaAssignment) \
            else assignment
        self.holders: dict[str, frozenset[str]] = {m: frozenset(ws) for m, ws in holders.items()}
        pinned: dict[str, list[str]] = {}
        for model, ws in self.holders.items():
            for w in ws:
                pinned.setdefault(w, []).append(model)
        self.pinned: dict[str, tuple[str, ...]] = {w: tuple(ms) for w, ms in pinned.items()}
        self.count_pending = count_pending
        self._names: tuple[str, ...] | None = None
        self._masks: dict[str, np.ndarray] = {}
        self._pinned_mb: np.ndarray | None = None

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Rank order (critical path first); each task on its earliest-finish holder."""
        walk = Walk(dag, cluster, count_pending=self.count_pending)
        self._sync(walk)
        out: dict[str, Placement] = {}
        for name in walk.rank_order():
            est = walk.estimate(name)
            mask, why = self._where(walk, name, est, cluster)
            i = choose(est.finish, walk.avail, mask)
            reason = f"{why}, finish {float(est.finish[i]):.0f}ms"
            if est.load[i] > 0:
                reason += f" (load {float(est.load[i]):.0f}ms)"
            out[name] = walk.commit(name, i, est, reason)
        return Plan(self.name, {n: out[n] for n in dag.nodes})

    def _sync(self, walk: Walk) -> None:
        """Forget the per-worker masks when the snapshot's workers are not the last ones."""
        names = walk.arr.names
        if names is not self._names and names != self._names:
            self._names, self._masks, self._pinned_mb = names, {}, None

    def _holder_mask(self, walk: Walk, model: str) -> np.ndarray:
        mask = self._masks.get(model)
        if mask is None:
            held = self.holders.get(model, frozenset())
            mask = self._masks[model] = np.fromiter(
                (n in held for n in walk.arr.names), bool, len(walk.arr))
        return mask

    def _where(self, walk: Walk, name: str, est: Estimate, cluster: ClusterView
               ) -> tuple[np.ndarray | None, str]:
        """The candidate workers for one task, and why."""
        model = walk.dag.nodes[name].model
        if model is None:
            return est.restrict, "no model: earliest finish anywhere"
        mask = self._holder_mask(walk, model) & est.mask
        if mask.any():
            return mask, f"holds {model}"
        if self._pinned_mb is None:
            sizes = cluster.model_sizes_mb
            self._pinned_mb = np.fromiter(
                (sum(float(sizes.get(m, 0.0)) for m in self.pinned.get(n, ()))
                 for n in walk.arr.names), float, len(walk.arr))
        room = est.mask & (walk.arr.gpu_total_mb - self._pinned_mb >= walk.sizes[name])
        if not room.any():
            raise PlanningError(f"model {model!r} of task {name!r} has no replica and no "
                                f"worker has {walk.sizes[name]:g} MB beside its pinned models")
        return room, f"no replica of {model}: earliest finish anywhere"
