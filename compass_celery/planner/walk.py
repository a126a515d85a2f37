"""One plan in progress: what the policies learn as they place tasks one by one.

A :class:`Walk` takes the snapshot's columns (built once per snapshot), then after every
placement moves that worker's available time to the task's finish and records the model
as resident (and its memory as used) for later tasks of the same plan. Scoring a task
is a handful of numpy operations over all workers; no Python loop over workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from .batch import Forming, batch_key, forming_from_count, join_finish_ms
from .choose import candidates, check_inputs
from .cost import (
    Flight,
    Hidden,
    WorkerArrays,
    finish_ms,
    load_terms,
    run_ms,
    start_ms,
    worker_arrays,
)
from .rank import by_rank, successors, topo_order, upward_rank
from .types import ClusterView, DagSpec, Placement, PlanningError, TaskSpec


class Estimate(NamedTuple):
    """Per-worker arrays (ms) for one task; ``mask`` = workers that can hold its model.

    ``finish`` is what policies choose by: start, the whole load, run. ``hidden`` is the
    part of the load the worker makes while the task waits (``cost.hidden_load_ms``),
    which the placement's estimate takes off its finish."""

    mask: np.ndarray
    restrict: np.ndarray | None  # the mask, or None when every worker qualifies
    ready: np.ndarray
    start: np.ndarray
    load: np.ndarray
    transfer: np.ndarray
    run: np.ndarray
    finish: np.ndarray
    #: Workers where the task would join a forming batch (``planner.batch``): index ->
    #: the ms it adds to that worker's queue. None: no batch to join anywhere.
    joins: Mapping[int, float] | None = None
    hidden: np.ndarray | Hidden | None = None


class Walk:
    """Mutable per-plan state; ``use_load``/``use_transfer`` off gives HEFT's model;
    ``use_batch`` off ignores forming batches (workers that batch on their own)."""

    def __init__(
        self,
        dag: DagSpec,
        cluster: ClusterView,
        *,
        count_pending: bool = True,
        use_load: bool = True,
        use_transfer: bool = True,
        arrays: WorkerArrays | None = None,
        use_batch: bool = True,
    ) -> None:
        self.dag = dag
        self.cluster = cluster
        self.use_batch = use_batch
        # key -> worker index -> batch forming there; read from the views on first need
        self._forming: dict[str, dict[int, Forming]] | None = None
        self.sizes = check_inputs(dag, cluster)
        self.arr = arrays if arrays is not None else worker_arrays(cluster)
        self.use_load = use_load
        self.use_transfer = use_transfer
        self.avail = self.arr.available_ms(count_pending, cluster.now)
        self.free = self.arr.gpu_free_mb.copy()
        # per worker: when its loader is free (the loads under way, then this plan's)
        self.loader = np.zeros(len(self.arr))
        if self.arr.loading and use_load:
            self.loader = self.arr.loads_ahead(cluster.model_sizes_mb, cluster.now)[0].copy()
        self.finish: dict[str, float] = {}
        self.worker: dict[str, int] = {}
        self.succs = successors(dag)
        self.topo = topo_order(dag, self.succs)
        self.preds: dict[str, list[str]] = {n: [] for n in dag.nodes}
        for a, b in dag.edges:
            self.preds[b].append(a)
        self._load: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # copied on first write
        self._flight: dict[str, Flight] = {}  # loads under way
        self._masks: dict[float, tuple[np.ndarray, np.ndarray | None]] = {}
        self._zeros = np.zeros(len(self.arr))
        self._ranks: dict[bool, dict[str, float]] = {}  # with_transfer -> upward rank

    def rank_order(self, *, with_transfer: bool = True) -> list[str]:
        """The plan's tasks by upward rank, critical path first (HEFT's order); a lone
        task (every routed one) is its own order, with no rank to work out (two column
        means of the snapshot's arrays, new with each decision's charge)."""
        if len(self.topo) == 1:
            return list(self.topo)
        return by_rank(self.topo, self.upward_rank(with_transfer=with_transfer))

    def upward_rank(self, *, with_transfer: bool = True) -> dict[str, float]:
        """Each task's upward rank (``rank.upward_rank``), worked out once per plan."""
        got = self._ranks.get(with_transfer)
        if got is None:
            got = self._ranks[with_transfer] = upward_rank(
                self.dag, self.arr, self.topo, self.succs, with_transfer=with_transfer)
        return got

    def load_columns(self, model: str, size_mb: float) -> tuple[np.ndarray, np.ndarray]:
        """(load ms if it fits, load ms if it must evict), 0 where resident in this plan."""
        cols = self._load.get(model)
        return cols if cols is not None else self.arr.load_columns(model, size_mb)

    def _mark_resident(self, model: str, size_mb: float, i: int) -> None:
        """The model will be on worker ``i`` for later tasks of this plan."""
        cols = self._load.get(model)
        if cols is None:
            fit, evict = self.arr.load_columns(model, size_mb)
            cols = self._load[model] = (fit.copy(), evict.copy())
        if cols[0][i] or cols[1][i]:
            cols[0][i] = cols[1][i] = 0.0
            if not self.arr.is_loading(model, i):  # a load under way has its memory
                self.free[i] = max(float(self.free[i]) - size_mb, 0.0)

    def in_flight(self, model: str, size_mb: float) -> Flight:
        """(worker index, ms left) where ``model`` is being loaded, at the snapshot's time."""
        got = self._flight.get(model)
        if got is None:
            got = self._flight[model] = self.arr.queued_flight(
                model, size_mb, self.cluster.model_sizes_mb, self.cluster.now)
        return got

    def estimate(self, name: str) -> Estimate:
        """Score one task on every worker; its predecessors must already be placed."""
        task = self.dag.nodes[name]
        arr, size = self.arr, self.sizes[name]
        masks = self._masks.get(size)
        if masks is None:
            mask = candidates(arr, task, size)
            every = np.count_nonzero(mask) == len(mask)  # mask.all(), without its wrapper
            masks = self._masks[size] = (mask, None if every else mask)
        preds = self.preds[name]
        done, transfer = 0.0, self._zeros
        if preds:
            try:
                done = max(self.finish[p] for p in preds)
            except KeyError as exc:
                raise PlanningError(f"task {name!r} planned before predecessor {exc}") from None
            if self.use_transfer:
                transfer = self._transfer(preds)
        ready = done + transfer
        start = start_ms(self.avail, ready, arr.hop_ms)
        load = hidden = self._zeros
        if self.use_load and task.model is not None:
            load, hidden = load_terms(self.load_columns(task.model, size), size, self.free,
                                      ready, start, self.loader,
                                      self.in_flight(task.model, size))
        run = run_ms(task.exec_ms, arr.speed)
        fin = finish_ms(start, load, run)
        joins = self._joins(name, ready, start, load, run, fin, hidden) \
            if task.batch is not None and self.use_batch else None
        return Estimate(*masks, ready, start, load, transfer, run, fin, joins, hidden)

    def forming(self, task: TaskSpec) -> dict[int, Forming]:
        """Batches of batchable ``task``'s key forming per worker index, as this plan has
        left them: read from the views on first need (a published batch, or a count of
        queued inputs, ``batch.forming_from_count``)."""
        spec = task.batch
        assert spec is not None
        key = spec.key or batch_key(task.name, task.model)
        if self._forming is None:
            self._forming = {}
        got = self._forming.get(key)
        if got is None:
            got = self._forming[key] = {}
            curve = spec.curve_for(task.exec_ms)
            for i, w in enumerate(self.cluster.workers):
                f = w.forming.get(key)
                if f is None and w.queued_inputs.get(key):
                    f = forming_from_count(w.queued_inputs[key], spec, curve,
                                           queue_ms=float(self.avail[i]),
                                           speed=float(self.arr.speed[i]))
                if f is not None:
                    got[i] = Forming(*f)
        return got

    def _joins(self, name: str, ready: np.ndarray, start: np.ndarray, load: np.ndarray,
               run: np.ndarray, fin: np.ndarray, hidden: np.ndarray | Hidden
               ) -> dict[int, float] | None:
        """Where the batchable task would join a forming batch, the estimate rewritten
        there in place: it starts with the batch and finishes with it (``batch.
        join_finish_ms``, no load hidden); the dict says what it adds to each such
        worker's queue."""
        task = self.dag.nodes[name]
        spec = task.batch
        assert spec is not None
        forming = self.forming(task)
        if not forming:
            return None
        curve = spec.curve_for(task.exec_ms)
        speed = self.arr.speed
        joins: dict[int, float] = {}
        for i, f in forming.items():
            s = float(speed[i])
            end = join_finish_ms(f, spec, curve, ready_ms=float(ready[i]),
                                 load_ms=float(load[i]), speed=s)
            if end is None:
                continue
            if hidden[i]:  # read before ``start`` is rewritten (Hidden keeps what it read)
                hidden[i] = 0.0  # (a fresh array or a Hidden whenever anything is hidden)
            start[i] = f.start_ms
            run[i] = curve.of(f.size + 1) / s
            fin[i] = end
            joins[i] = curve.per_item_ms / s
        return joins or None

    def _transfer(self, preds: list[str]) -> np.ndarray:
        """ms to pull every input not produced on the worker (see ``cost.transfer_ms``)."""
        total = 0.0
        here: dict[int, float] = {}
        for p in preds:
            out = self.dag.nodes[p].output_kb
            total += out
            w = self.worker[p]
            here[w] = here.get(w, 0.0) + out
        if not total:
            return self._zeros
        kb = np.full(len(self.arr), total)
        for w, on in here.items():
            kb[w] = total - on
        return kb * self.arr.ms_per_kb

    def commit(self, name: str, i: int, est: Estimate, reason: str) -> Placement:
        """Place ``name`` on worker ``i``: the worker is busy until it finishes, and
        its model is expected resident there for the rest of this plan."""
        task = self.dag.nodes[name]
        hidden = float(est.hidden[i]) if est.hidden is not None else 0.0
        start, ready = float(est.start[i]), float(est.ready[i])
        fin = float(est.finish[i]) if not hidden else \
            float(finish_ms(start, est.load[i] - hidden, est.run[i]))  # the load's rest only
        joined = est.joins.get(i) if est.joins is not None else None
        if joined is not None:  # the batch ahead grows by one input; so does the queue
            self.avail[i] += joined
            forming = self.forming(task)
            forming[i] = Forming(forming[i].size + 1, forming[i].start_ms)
            reason += f"; joins a forming batch ({forming[i].size} inputs)"
        else:
            self.avail[i] = fin
            if task.batch is not None and self.use_batch:  # a new batch forms behind
                self.forming(task)[i] = Forming(1, start)
        self.finish[name] = fin
        self.worker[name] = i
        if task.model is not None and self.use_load:
            self._mark_resident(task.model, self.sizes[name], i)
            if hidden:  # the worker's loader is busy until this prefetch is done
                self.loader[i] = max(float(self.loader[i]), ready) + float(est.load[i])
            elif est.load[i] > 0:  # ... or until this load is (it ends as the task starts)
                self.loader[i] = max(float(self.loader[i]), start + float(est.load[i]))
        return Placement(
            task=name,
            worker=self.arr.names[i],
            queue=self.arr.queues[i],
            start_ms=start,
            finish_ms=fin,
            wait_ms=start - ready,
            load_ms=float(est.load[i]) - hidden,
            transfer_ms=float(est.transfer[i]),
            run_ms=float(est.run[i]),
            reason=reason,
            charge_ms=joined,
            prefetch_ms=hidden,
            hop_ms=0.0 if joined is not None else float(self.arr.hop_ms[i]),
        )
