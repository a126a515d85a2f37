"""One plan in progress: what the policies learn as they place tasks one by one.

A :class:`Walk` copies the snapshot's columns once, then after every placement moves
that worker's available time to the task's finish and records the model as resident
(and its memory as used) for later tasks of the same plan. Scoring a task is a handful
of numpy operations over all workers; no Python loop over workers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .choose import candidates, check_inputs
from .cost import WorkerArrays, finish_ms, load_ms, run_ms, transfer_ms, worker_arrays
from .types import ClusterView, DagSpec, Placement, PlanningError


class Estimate(NamedTuple):
    """Per-worker arrays (ms) for one task; ``mask`` = workers that can hold its model."""

    mask: np.ndarray
    ready: np.ndarray
    start: np.ndarray
    load: np.ndarray
    transfer: np.ndarray
    run: np.ndarray
    finish: np.ndarray


class Walk:
    """Mutable per-plan state; ``use_load``/``use_transfer`` off gives HEFT's model."""

    def __init__(
        self,
        dag: DagSpec,
        cluster: ClusterView,
        *,
        count_pending: bool = True,
        use_load: bool = True,
        use_transfer: bool = True,
        arrays: WorkerArrays | None = None,
    ) -> None:
        self.dag = dag
        self.sizes = check_inputs(dag, cluster)
        self.arr = arrays if arrays is not None else worker_arrays(cluster)
        self.use_load = use_load
        self.use_transfer = use_transfer
        self.avail = self.arr.available_ms(count_pending)
        self.free = self.arr.gpu_free_mb.copy()
        self.finish: dict[str, float] = {}
        self.worker: dict[str, int] = {}
        self.preds: dict[str, list[str]] = {n: [] for n in dag.nodes}
        for a, b in dag.edges:
            self.preds[b].append(a)
        self._resident: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._zeros = np.zeros(len(self.arr))

    def resident(self, model: str) -> tuple[np.ndarray, np.ndarray]:
        """(GPU-resident, host-resident) columns for a model, as updated by this plan."""
        cols = self._resident.get(model)
        if cols is None:
            j = self.arr.models[model]
            cols = (self.arr.resident[:, j].copy(), self.arr.host_resident[:, j])
            self._resident[model] = cols
        return cols

    def estimate(self, name: str) -> Estimate:
        """Score one task on every worker; its predecessors must already be placed."""
        task = self.dag.nodes[name]
        arr = self.arr
        mask = candidates(arr, task, self.sizes[name])
        preds = self.preds[name]
        try:
            done = max((self.finish[p] for p in preds), default=0.0)
        except KeyError as exc:
            raise PlanningError(f"task {name!r} planned before its predecessor {exc}") from None
        transfer = self._zeros
        if self.use_transfer and preds:
            kb = self._zeros
            for p in preds:
                out = self.dag.nodes[p].output_kb
                if out:
                    kb = kb + np.where(arr.positions == self.worker[p], 0.0, out)
            if kb is not self._zeros:
                transfer = transfer_ms(kb, arr.net_mb_per_s)
        ready = done + transfer
        start = np.maximum(self.avail, ready)
        load = self._zeros
        if self.use_load and task.model is not None:
            res, host = self.resident(task.model)
            load = load_ms(
                self.sizes[name], res, host, self.free, arr.load_mb_per_s, arr.host_load_mb_per_s
            )
        run = run_ms(task.exec_ms, arr.speed)
        return Estimate(mask, ready, start, load, transfer, run, finish_ms(start, load, run))

    def commit(self, name: str, i: int, est: Estimate, reason: str) -> Placement:
        """Place ``name`` on worker ``i``: the worker is busy until it finishes, and
        its model is expected resident there for the rest of this plan."""
        task = self.dag.nodes[name]
        fin = float(est.finish[i])
        self.avail[i] = fin
        self.finish[name] = fin
        self.worker[name] = i
        if task.model is not None:
            res, _ = self.resident(task.model)
            if not res[i]:
                res[i] = True
                self.free[i] = max(float(self.free[i]) - self.sizes[name], 0.0)
        start = float(est.start[i])
        return Placement(
            task=name,
            worker=self.arr.names[i],
            queue=self.arr.queues[i],
            start_ms=start,
            finish_ms=fin,
            wait_ms=start - float(est.ready[i]),
            load_ms=float(est.load[i]),
            transfer_ms=float(est.transfer[i]),
            run_ms=float(est.run[i]),
            reason=reason,
        )
