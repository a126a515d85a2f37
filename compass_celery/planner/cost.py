"""Cost terms of the planner: a task's finish on a worker = wait + load + transfer + run.

Each term is a few lines with its unit stated, written once over numpy arrays (one
element per worker, built once per :class:`ClusterView` by :func:`worker_arrays`) so
that planning stays fast at 1,000 workers. :func:`scalar_costs` is the same model in
plain Python for one worker: tests hold the numpy path to it.

Units: ms, MB, MB/s; task outputs in KB (1 MB = 1000 KB).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from .types import ClusterView, WorkerView

KB_PER_MB = 1000.0
MS_PER_S = 1000.0
# Loading into memory that is not free means evicting first: the authors'
# implementation doubles the load time, and so do we.
EVICTION_PENALTY = 2.0


class Flight(NamedTuple):
    """Loads of one model under way (``WorkerArrays.in_flight``): the workers' indices
    and the ms of each load left to run."""

    at: np.ndarray
    left: np.ndarray


#: No load of the model under way anywhere.
NO_FLIGHT = Flight(np.zeros(0, dtype=np.intp), np.zeros(0))
NO_FLIGHT.at.flags.writeable = NO_FLIGHT.left.flags.writeable = False


@dataclass(frozen=True, eq=False)
class WorkerArrays:
    """Per-worker columns of a snapshot, index i = ``cluster.workers[i]``."""

    names: tuple[str, ...]
    queues: tuple[str, ...]
    index: dict[str, int]
    backlog_ms: np.ndarray
    pending_ms: np.ndarray
    speed: np.ndarray
    gpu_free_mb: np.ndarray
    gpu_total_mb: np.ndarray
    load_mb_per_s: np.ndarray
    host_load_mb_per_s: np.ndarray
    net_mb_per_s: np.ndarray
    hop_ms: np.ndarray  # per-task dispatch before each start (WorkerView.hop_ms)
    positions: np.ndarray  # 0..n-1
    ms_per_kb: np.ndarray  # transfer cost of one KB of input, from net_mb_per_s
    ms_per_mb: np.ndarray  # load cost of one MB of model from storage
    host_ms_per_mb: np.ndarray  # load cost of one MB of model from host RAM
    models: dict[str, int]  # model name -> column of the resident matrices
    resident: np.ndarray  # bool (workers, models): model in GPU memory
    host_resident: np.ndarray  # bool (workers, models): model in host RAM
    host_models: list[bool]  # per model: in host RAM anywhere at all
    #: Learned storage-to-device load ms per model (``ClusterView.load_ms``).
    learned_load_ms: Mapping[str, float] = field(default_factory=dict)
    #: Loads under way (``WorkerView.loading``) by worker index, for the workers loading
    #: something: model -> (began, ends).
    loading: Mapping[int, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    #: Tasks running now (``WorkerView.running``), one column per task a worker runs at
    #: once (workers by rows, padded with zero charges): when each began, when it should
    #: end, and what it charged; :meth:`backlog_left_ms` takes off what of them has run.
    run_began: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    run_ends: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    run_charge: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    # Per-snapshot memo of model-dependent columns (same snapshot, same answer).
    _fetch: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    _fits: dict[float, np.ndarray] = field(default_factory=dict)
    _some: dict[float, bool] = field(default_factory=dict)  # fits(size).any()
    _means: dict[tuple[str, bool], float] = field(default_factory=dict)
    _left: dict[float | None, np.ndarray] = field(default_factory=dict)  # None: the rates
    #: model -> (the ``loading`` it was read from, indices, began, ends): the loads of a
    #: model under way, as columns (``loading`` is fixed per arrays; the identity check
    #: keeps a memo shared by an evolved copy with other loads from answering for it)
    _spans: dict[str, tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict)
    #: model -> (``loading``, its whole-load column, the clock, ``in_flight``'s answer):
    #: the last answer, for the decisions a producer makes on one snapshot at one clock
    _flights: dict[str, tuple[Any, np.ndarray, float, Flight]] = field(default_factory=dict)
    #: :meth:`loads_ahead`'s last answer, with the ``loading`` and the clock it was read at
    _ahead: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)

    def fits(self, size_mb: float) -> np.ndarray:
        """Bool mask of workers whose GPU is large enough for a model of this size."""
        mask = self._fits.get(size_mb)
        if mask is None:
            mask = self._fits[size_mb] = self.gpu_total_mb >= size_mb
        return mask

    def fits_any(self, size_mb: float) -> bool:
        """Whether any worker's GPU is large enough for a model of this size."""
        some = self._some.get(size_mb)
        if some is None:
            some = self._some[size_mb] = bool(self.fits(size_mb).any())
        return some

    def load_columns(self, model: str, size_mb: float) -> tuple[np.ndarray, np.ndarray]:
        """(load ms if it fits in free memory, load ms if it must evict) per worker,
        0 where the model is GPU-resident in the snapshot. Read-only: copy to change."""
        cols = self._fetch.get(model)
        if cols is None:
            j = self.models[model]
            learned = self.learned_load_ms.get(model)
            fetch = size_mb * self.ms_per_mb if learned is None else np.full(len(self), learned)
            if self.host_models[j]:
                fetch = np.where(self.host_resident[:, j], size_mb * self.host_ms_per_mb, fetch)
            fit = np.where(self.resident[:, j], 0.0, fetch)
            cols = (fit, fit * EVICTION_PENALTY)
            self._fetch[model] = cols
        return cols

    def in_flight(self, model: str, size_mb: float, now: float) -> Flight:
        """(worker indices, ms left) of the workers loading ``model`` at ``now``: its whole
        load there (:meth:`load_columns`) times the share of the load still to run
        (:func:`left_shares`). The spans are read once per arrays, as columns, and the
        last answer is kept for the same clock: a producer's folded loads can leave most
        workers loading a model, and every decision on a snapshot asks again. Read-only."""
        whole = self.load_columns(model, size_mb)[0]
        last = self._flights.get(model)
        if last is not None and last[0] is self.loading and last[1] is whole \
                and last[2] == now:
            return last[3]
        spans = self._spans.get(model)
        if spans is None or spans[0] is not self.loading:
            at = [(i, on[model]) for i, on in self.loading.items() if model in on]
            spans = self._spans[model] = (
                self.loading, np.fromiter((i for i, _ in at), dtype=np.intp, count=len(at)),
                np.fromiter((b for _, (b, _) in at), dtype=float, count=len(at)),
                np.fromiter((e for _, (_, e) in at), dtype=float, count=len(at)))
        _, at, began, ends = spans
        flight = NO_FLIGHT
        if len(at):
            left = whole[at] * left_shares(began, ends, now)
            left.flags.writeable = False  # shared by the plans that ask at this clock
            flight = Flight(at, left)
        self._flights[model] = (self.loading, whole, now, flight)
        return flight

    def loads_ahead(self, sizes_mb: Mapping[str, float], now: float
                    ) -> tuple[np.ndarray, dict[tuple[int, str], float]]:
        """A worker loads one model at a time (``ModelCache``; the simulated worker alike),
        so a load waits for the loads under way there. Per worker: ms until its loader is
        free (what is left of each load under way, summed); and per (worker, model) under
        way, ms until that load ends (the loads that end no later, summed: a preload hint's
        models queue one behind another). Without it a plan counted a new worker's fifth
        preload, or a load behind them, as starting now, and shed the jobs it admitted
        there (docs/results/autoscale-sim.txt). Read-only."""
        last = self._ahead.get("at")
        if last is not None and last[0] is self.loading and last[1] == now:
            return last[2], last[3]
        rows = self._ahead_rows(sizes_mb)
        busy = np.zeros(len(self))
        ends_by: dict[tuple[int, str], float] = {}
        if rows is not None:  # a running sum per worker, in the order its loads end
            keys_, at, whole, began, ends, groups, last_of = rows
            if len(keys_) > _FEW_LOADS:
                acc = whole * left_shares(began, ends, now)
                for a, b in groups:  # sequential, as a Python sum: float for float
                    acc[a:b] = np.add.accumulate(acc[a:b])
                busy[at[last_of]] = acc[last_of]
                ends_by = dict(zip(keys_, acc.tolist(), strict=True))
            else:  # a few loads (the usual case): the same operations in Python floats
                got = [w * _left_share_as_np(b, e, now) for w, b, e in
                       zip(whole.tolist(), began.tolist(), ends.tolist(), strict=True)]
                for a, b in groups:
                    for k in range(a + 1, b):
                        got[k] = got[k - 1] + got[k]
                busy[at[last_of]] = [got[k] for k in last_of.tolist()]
                ends_by = dict(zip(keys_, got, strict=True))
        busy.flags.writeable = False
        self._ahead["at"] = (self.loading, now, busy, ends_by)
        return busy, ends_by

    def _ahead_rows(self, sizes_mb: Mapping[str, float]) -> tuple[Any, ...] | None:
        """The loads under way as rows for :meth:`loads_ahead`, kept while ``loading``, the
        sizes and the load columns are the same objects (the clock moves far more often
        than the loads change): per row
        its (worker, model), worker, whole load ms, span; each worker's rows in the order
        its loads end; the slices of workers with more than one; each worker's last row."""
        kept = self._ahead.get("rows")
        if kept is not None and kept[0] is self.loading and kept[1] is sizes_mb \
                and kept[2] is self._fetch:  # the load columns it read are the same too
            return kept[3]
        keys_: list[tuple[int, str]] = []
        spans: list[tuple[float, float, float]] = []
        groups: list[tuple[int, int]] = []
        last_of: list[int] = []
        for i, on in self.loading.items():
            first = len(keys_)
            for model, (began, ends) in sorted(on.items(), key=lambda kv: kv[1][1]):
                size = sizes_mb.get(model)
                if model not in self.models or size is None:
                    continue
                keys_.append((i, model))
                spans.append((float(self.load_columns(model, float(size))[0][i]), began, ends))
            if len(keys_) - first > 1:
                groups.append((first, len(keys_)))
            if len(keys_) > first:
                last_of.append(len(keys_) - 1)
        rows = None
        if keys_:
            whole, began, ends = (np.array(c, dtype=float) for c in zip(*spans, strict=True))
            at = np.array([i for i, _ in keys_], dtype=np.intp)
            rows = (keys_, at, whole, began, ends, groups, np.array(last_of, dtype=np.intp))
        self._ahead["rows"] = (self.loading, sizes_mb, self._fetch, rows)
        return rows

    def queued_flight(self, model: str, size_mb: float, sizes_mb: Mapping[str, float],
                      now: float) -> Flight:
        """:meth:`in_flight`, where a worker loads other models too each load ending no
        sooner than the loads queued ahead of it there end (:meth:`loads_ahead`)."""
        flight = self.in_flight(model, size_mb, now)
        queued = [k for k, i in enumerate(flight.at.tolist()) if len(self.loading[i]) > 1]
        if not queued:
            return flight
        ends = self.loads_ahead(sizes_mb, now)[1]
        left = flight.left.copy()
        for k in queued:
            left[k] = max(float(left[k]), ends.get((int(flight.at[k]), model), 0.0))
        return Flight(flight.at, left)

    def is_loading(self, model: str, i: int) -> bool:
        """Whether worker ``i`` is loading ``model`` (its memory already taken)."""
        return model in self.loading.get(i, ())

    def mean(self, column: str, inverse: bool = False) -> float:
        """The mean of a column (of its inverse): the same for every plan on this snapshot."""
        value = self._means.get((column, inverse))
        if value is None:
            values = getattr(self, column)
            value = self._means[(column, inverse)] = float(
                np.mean(1.0 / values if inverse else values))
        return value

    def backlog_left_ms(self, now: float) -> np.ndarray:
        """Each worker's backlog at ``now`` less the part of its running tasks already run
        (:func:`ran_ms`; the scalar reference is :func:`backlog_left_ms`). Read-only."""
        left = self._left.get(now)
        if left is None:
            width = self.run_charge.shape[1]
            if not width:  # nothing runs anywhere
                left = self.backlog_ms
            else:
                rate = self._left.get(None)
                if rate is None:  # per snapshot; only the clock changes between plans
                    rate = run_rate(self.run_began, self.run_ends, self.run_charge)
                ran = ran_ms(self.run_began, rate, self.run_charge, now)
                left = np.maximum(self.backlog_ms - (ran[:, 0] if width == 1 else
                                                     ran.sum(axis=1)), 0.0)
                if len(self._left) > 4:  # one snapshot, a few clocks (the simulator's)
                    self._left.clear()
                self._left[None] = rate
            self._left[now] = left
        return left

    def available_ms(self, count_pending: bool, now: float = 0.0) -> np.ndarray:
        """ms until each worker is free: backlog (less what its running tasks have run by
        ``now``), plus planned-not-sent work if counted."""
        left = self.backlog_left_ms(now)
        return left + self.pending_ms if count_pending else left.copy()


_FIELDS = (
    "backlog_ms",
    "pending_ms",
    "speed",
    "gpu_free_mb",
    "gpu_total_mb",
    "load_mb_per_s",
    "host_load_mb_per_s",
    "net_mb_per_s",
    "hop_ms",
)
_row = attrgetter(*_FIELDS)
# Memo by snapshot identity (snapshots are immutable values); entries leave with them.
_CACHE: dict[int, tuple[weakref.ref[ClusterView], WorkerArrays]] = {}


def worker_arrays(cluster: ClusterView) -> WorkerArrays:
    """The snapshot's columns, built once per (immutable) snapshot and then reused."""
    hit = _CACHE.get(id(cluster))
    if hit is not None and hit[0]() is cluster:
        return hit[1]
    arrays = build_worker_arrays(cluster)
    remember_arrays(cluster, arrays)
    return arrays


#: The shortest span a running task is taken to last (clock units): an empty one has all
#: of its charge run as soon as it began, and nothing divides by zero.
MIN_SPAN = 1e-9


def run_rate(began: Any, ends: Any, charge_ms: Any) -> Any:
    """How fast a running task's charge runs: ms of it per unit of the clock, from its
    span [``began``, ``ends``] (at least :data:`MIN_SPAN` long). Elementwise, as
    :func:`ran_ms`."""
    return charge_ms / np.maximum(ends - began, MIN_SPAN)


def ran_ms(began: Any, rate: Any, charge_ms: Any, now: float) -> Any:
    """The part of a running task's charge already run at ``now``: from ``began`` at
    ``rate`` (:func:`run_rate`), clipped to 0..``charge_ms`` (the worker's clock and the
    reader's may differ a little; a task still running past its expected end is counted
    as about to end). Elementwise on numpy arrays (``WorkerArrays.backlog_left_ms``) or
    on floats: the one rule for every reader of a backlog, the simulator's too."""
    return np.minimum(np.maximum((now - began) * rate, 0.0), charge_ms)


def backlog_left_ms(worker: WorkerView, now: float) -> float:
    """The scalar reference of ``WorkerArrays.backlog_left_ms``: ``worker``'s backlog at
    ``now`` less what its running tasks have run (:func:`ran_ms`), never below 0."""
    if not worker.running:
        return worker.backlog_ms
    ran = sum(float(ran_ms(b, run_rate(b, e, c), c, now)) for b, e, c in worker.running)
    return max(worker.backlog_ms - ran, 0.0)


def settled(worker: WorkerView, charge_ms: float) -> WorkerView:
    """``worker`` once a task that charged it ``charge_ms`` has ended, before its record
    and backlog say so: the charge off its backlog, and the task (the first running one
    of that charge) off what runs, so that what it ran is not taken off a second time."""
    running = list(worker.running)
    for k, span in enumerate(running):
        if span[2] == charge_ms:
            del running[k]
            break
    return evolve(worker, backlog_ms=max(0.0, worker.backlog_ms - charge_ms),
                  running=tuple(running))


def left_share(began: float, ends: float, now: float) -> float:
    """The share of a load under way still to run at ``now``, 0 to 1 (clipped: the
    worker's clock and the reader's may differ a little)."""
    if ends <= began:
        return 0.0
    return min(max((ends - now) / (ends - began), 0.0), 1.0)


#: Loads under way up to which ``WorkerArrays.loads_ahead`` sums in Python floats.
_FEW_LOADS = 64


def _left_share_as_np(began: float, ends: float, now: float) -> float:
    """One element of :func:`left_shares`, float for float (its NaN and tie rules, which
    :func:`left_share` does not keep for a NaN span)."""
    span = ends - began
    if not span > 0.0:
        return 0.0
    share = (ends - now) / span
    return 0.0 if share < 0.0 else 1.0 if share > 1.0 else share


def left_shares(began: np.ndarray, ends: np.ndarray, now: float) -> np.ndarray:
    """:func:`left_share` of many loads at once, float for float the same (the ``where``
    compares are Python's ``max``/``min`` on two floats: ties and -0.0 kept alike)."""
    span = ends - began
    live = span > 0.0
    share = np.divide(ends - now, span, out=np.zeros(len(span)), where=live)
    share = np.where(share < 0.0, 0.0, share)
    return np.where(share > 1.0, 1.0, share)


def remember_arrays(cluster: ClusterView, arrays: WorkerArrays) -> None:
    """Use ``arrays`` as the snapshot's columns from now on.

    For a caller that keeps the columns up to date itself as workers change (the
    simulator), so no plan pays the pass over every worker. ``arrays`` must equal what
    :func:`build_worker_arrays` would build from ``cluster``; the planner never writes it.
    """
    key = id(cluster)
    _CACHE[key] = (weakref.ref(cluster, lambda _: _CACHE.pop(key, None)), arrays)


def build_worker_arrays(cluster: ClusterView) -> WorkerArrays:
    """One Python pass over the workers; everything after it is numpy."""
    workers = cluster.workers
    n = len(workers)
    flat = chain.from_iterable(map(_row, workers))
    table = np.fromiter(flat, dtype=float, count=n * len(_FIELDS)).reshape(n, len(_FIELDS))
    models = {m: j for j, m in enumerate(cluster.model_sizes_mb)}
    resident = _membership(workers, "resident", models)
    host = _membership(workers, "host_resident", models)
    names = tuple(w.name for w in workers)
    columns = {f: np.ascontiguousarray(table[:, k]) for k, f in enumerate(_FIELDS)}
    return WorkerArrays(
        **run_columns([w.running for w in workers]),
        names=names,
        queues=tuple(w.queue for w in workers),
        index={name: i for i, name in enumerate(names)},
        positions=np.arange(n),
        models=models,
        resident=resident,
        host_resident=host,
        host_models=host.any(axis=0).tolist(),
        learned_load_ms=dict(cluster.load_ms),
        loading={i: w.loading for i, w in enumerate(workers) if w.loading},
        ms_per_kb=MS_PER_S / (KB_PER_MB * columns["net_mb_per_s"]),
        ms_per_mb=MS_PER_S / columns["load_mb_per_s"],
        host_ms_per_mb=MS_PER_S / columns["host_load_mb_per_s"],
        **columns,
    )


#: A worker's running tasks as ``WorkerView.running`` holds them: (began, ends, charge_ms).
Spans = tuple[tuple[float, float, float], ...]


def run_columns(running: Sequence[Spans]) -> dict[str, np.ndarray]:
    """The ``run_*`` columns of :class:`WorkerArrays` from each worker's running tasks:
    a row per worker, its tasks packed from the left, as many columns as the busiest
    worker runs tasks (0 when none runs); a task that charged nothing is left out."""
    rows: list[int] = []
    ks: list[int] = []
    spans: list[tuple[float, float, float]] = []
    for i, on in enumerate(running):
        if on:
            for k, span in enumerate(s for s in on if s[2] > 0):
                rows.append(i)
                ks.append(k)
                spans.append(span)
    cols = np.zeros((3, len(running), max(ks) + 1 if ks else 0))
    if spans:
        cols[:, rows, ks] = np.array(spans, dtype=float).T
    return {"run_began": cols[0], "run_ends": cols[1], "run_charge": cols[2]}


def _run_rows(arrays: WorkerArrays, at: np.ndarray, running: Sequence[Spans]
              ) -> dict[str, np.ndarray]:
    """The ``run_*`` columns with the rows ``at`` rewritten from ``running`` (copies), as
    :func:`run_columns` would build them for every row."""
    new = run_columns(running)
    n, m = len(arrays), max(arrays.run_charge.shape[1], new["run_charge"].shape[1])
    out = {}
    for name in ("run_began", "run_ends", "run_charge"):
        col = np.zeros((n, m))
        old = getattr(arrays, name)
        col[:, :old.shape[1]] = old
        col[at] = 0.0
        col[at, :new[name].shape[1]] = new[name]
        out[name] = col
    width = int((out["run_charge"] > 0).sum(axis=1).max()) if n else 0
    return {name: np.ascontiguousarray(col[:, :width]) for name, col in out.items()}


def with_rows(arrays: WorkerArrays, rows: Mapping[int, WorkerView],
              before: Mapping[int, WorkerView] | None = None) -> WorkerArrays:
    """``arrays`` with the workers at positions ``rows`` replaced by new views of the same
    workers: what :func:`build_worker_arrays` would build, for a pass over the changed rows
    only. The original is left as it was: a column that changed is copied, then written;
    one that did not (a backlog charge changes one number of one column) is shared, with
    the memos that depend only on unchanged columns. ``before``, the views the rows had
    (same positions), makes finding what changed a few tuple compares per row."""
    if not rows:
        return arrays
    if before is not None and len(rows) <= 8:
        charged = _charged_rows(arrays, rows, before)
        if charged is not None:
            return charged
    at = np.fromiter(rows, dtype=int, count=len(rows))
    views = list(rows.values())
    width = len(_FIELDS)
    table = np.fromiter(chain.from_iterable(map(_row, views)), dtype=float,
                        count=len(views) * width).reshape(len(views), width)
    if before is not None:
        old = [before[i] for i in rows]
        if len(old) <= 8:  # a few rows (backlog charges): tuple compares beat numpy's setup
            fields = sorted({k for w, o in zip(views, old, strict=True) for k, (a, b)
                             in enumerate(zip(_row(w), _row(o), strict=True)) if a != b})
        else:
            was = np.fromiter(chain.from_iterable(map(_row, old)), dtype=float,
                              count=len(views) * width).reshape(len(views), width)
            fields = np.flatnonzero((table != was).any(axis=0)).tolist()
        sets: set[str] = set()
        ran = False
        for w, o in zip(views, old, strict=True):  # decoded sets are shared: mostly `is`
            ran = ran or (w.running is not o.running and w.running != o.running)
            if w.resident is not o.resident and w.resident != o.resident:
                sets.add("resident")
            if w.host_resident is not o.host_resident and w.host_resident != o.host_resident:
                sets.add("host_resident")
    else:
        fields = [k for k, f in enumerate(_FIELDS)
                  if not np.array_equal(getattr(arrays, f)[at], table[:, k])]
        sets = {"resident", "host_resident"}
        ran = True
    changes: dict[str, Any] = {}
    if ran:
        changes.update(_run_rows(arrays, at, [w.running for w in views]))
    for k in fields:
        changes[_FIELDS[k]] = column = getattr(arrays, _FIELDS[k]).copy()
        column[at] = table[:, k]
    for attr in sets:
        old = getattr(arrays, attr)
        new = _membership(views, attr, arrays.models)
        if not np.array_equal(old[at], new):
            changes[attr] = matrix = old.copy()
            matrix[at] = new
    if "host_resident" in changes:
        changes["host_models"] = changes["host_resident"].any(axis=0).tolist()
    if "net_mb_per_s" in changes:
        changes["ms_per_kb"] = MS_PER_S / (KB_PER_MB * changes["net_mb_per_s"])
    if "load_mb_per_s" in changes:
        changes["ms_per_mb"] = MS_PER_S / changes["load_mb_per_s"]
    if "host_load_mb_per_s" in changes:
        changes["host_ms_per_mb"] = MS_PER_S / changes["host_load_mb_per_s"]
    if changes.keys() & {"resident", "host_resident", "load_mb_per_s", "host_load_mb_per_s"}:
        changes["_fetch"] = {}  # load_columns reads these
    if "gpu_total_mb" in changes:
        changes["_fits"] = {}
        changes["_some"] = {}
    if changes.keys() & {"backlog_ms", "run_charge"}:
        changes["_left"] = _rates_kept(arrays, changes)  # backlog_left_ms reads these
    if arrays.loading or any(w.loading for w in rows.values()):
        loading = {i: on for i, on in arrays.loading.items() if i not in rows}
        loading.update((i, w.loading) for i, w in rows.items() if w.loading)
        if loading != arrays.loading:
            changes["loading"] = loading
    if not changes:
        return arrays
    if arrays._means:
        changes["_means"] = {k: v for k, v in arrays._means.items() if k[0] not in changes}
    return evolve(arrays, **changes)


def _rates_kept(arrays: WorkerArrays, changes: Mapping[str, Any]
                ) -> dict[float | None, np.ndarray]:
    """A new ``_left`` memo for ``arrays`` evolved with ``changes``: the backlogs left
    dropped, the running tasks' rates kept while the run columns are the same ones."""
    rate = arrays._left.get(None)
    return {} if rate is None or "run_charge" in changes else {None: rate}


#: The fields a producer's own charges change (``state.reader.note_charge``): of the
#: columns, only the backlog and the planned work.
_CHARGED = frozenset({"backlog_ms", "pending_ms", "queued_ms", "pending_queued_ms",
                      "queued_inputs"})


def _charged_rows(arrays: WorkerArrays, rows: Mapping[int, WorkerView],
                  before: Mapping[int, WorkerView]) -> WorkerArrays | None:
    """:func:`with_rows` for rows whose views differ from ``before`` by charges only (a
    router's own decisions: evolved views sharing every other field), with no pass over
    the other fields: the backlog (and planned work) column copied and those rows
    written. None when a row changed anything else."""
    for i, w in rows.items():
        was = before[i].__dict__
        for k, v in w.__dict__.items():
            if v is not was[k] and k not in _CHARGED:
                return None
    changes: dict[str, Any] = {}
    for name in ("backlog_ms", "pending_ms"):
        column = getattr(arrays, name)
        for i, w in rows.items():
            value = getattr(w, name)
            if value != column[i]:
                if name not in changes:
                    column = changes[name] = column.copy()
                column[i] = value
    if not changes:
        return arrays
    if "backlog_ms" in changes:
        changes["_left"] = _rates_kept(arrays, changes)  # backlog_left_ms reads it
    if arrays._means:
        changes["_means"] = {k: v for k, v in arrays._means.items() if k[0] not in changes}
    return evolve(arrays, **changes)


def evolve(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace(obj, **changes)`` without re-running the constructor, for the
    immutable values the planner copies on every routed decision (several times faster;
    ``changes`` must already be valid)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def _membership(workers: Sequence[WorkerView], attr: str, models: dict[str, int]) -> np.ndarray:
    """Bool matrix (workers, models) from each worker's set ``attr``; comprehensions, not
    appends, because this is the one pass over all workers per snapshot."""
    sets = [getattr(w, attr) for w in workers]
    out = np.zeros((len(sets), len(models)), dtype=bool)
    cols = [models.get(m, -1) for s in sets for m in s]
    if cols:
        rows = np.repeat(np.arange(len(sets)), [len(s) for s in sets])
        c = np.array(cols)
        known = c >= 0
        out[rows[known], c[known]] = True
    return out


def start_ms(available_ms: np.ndarray, ready_ms: np.ndarray | float,
             hop_ms: np.ndarray | float) -> np.ndarray:
    """ms from now until the run starts: the worker free and the inputs in, then the
    worker's per-task dispatch (``WorkerView.hop_ms``: the message's pick, bookkeeping)."""
    return np.maximum(available_ms, ready_ms) + hop_ms


def fetch_ms(
    size_mb: float,
    host_resident: np.ndarray,
    load_mb_per_s: np.ndarray,
    host_load_mb_per_s: np.ndarray,
) -> np.ndarray:
    """ms to copy the model to the GPU: from host RAM if it is there, else from storage."""
    per_mb = np.where(host_resident, MS_PER_S / host_load_mb_per_s, MS_PER_S / load_mb_per_s)
    return size_mb * per_mb


def load_from_fetch_ms(
    fetch: np.ndarray, size_mb: float, resident: np.ndarray, free_mb: np.ndarray
) -> np.ndarray:
    """ms before the model is usable: 0 if GPU-resident, else the fetch time, times
    EVICTION_PENALTY when the model does not fit in free memory (evict first)."""
    return np.where(resident, 0.0, np.where(size_mb > free_mb, fetch * EVICTION_PENALTY, fetch))


def load_ms(
    size_mb: float,
    resident: np.ndarray,
    host_resident: np.ndarray,
    free_mb: np.ndarray,
    load_mb_per_s: np.ndarray,
    host_load_mb_per_s: np.ndarray,
) -> np.ndarray:
    """ms to get the model into GPU memory (fetch_ms, then load_from_fetch_ms)."""
    fetch = fetch_ms(size_mb, host_resident, load_mb_per_s, host_load_mb_per_s)
    return load_from_fetch_ms(fetch, size_mb, resident, free_mb)


def transfer_ms(kb_elsewhere: np.ndarray, net_mb_per_s: np.ndarray) -> np.ndarray:
    """ms to pull the inputs that are not already on the worker (KB over MB/s)."""
    return kb_elsewhere * (MS_PER_S / (KB_PER_MB * net_mb_per_s))


def run_ms(exec_ms: float, speed: np.ndarray) -> np.ndarray:
    """ms of compute: the profiled run time scaled by the worker's speed factor."""
    return exec_ms / speed


def hidden_load_ms(ready: np.ndarray | float, start: np.ndarray, load: np.ndarray,
                   fits: np.ndarray, loader_free: np.ndarray | float = 0.0) -> np.ndarray:
    """ms of each worker's load that runs while the task waits in its queue.

    A worker prefetches a queued task's model into free memory while the tasks ahead
    run, one load at a time (``ModelCache.prefetch``; the simulated worker alike). A load
    that fits (``fits``) so starts when the task reaches the queue (``ready``) or when the
    worker's loader is free, whichever is later, and only the rest of it delays the start.
    A load that must evict waits for the task's turn: none of it is hidden. The choice
    still charges the whole load (``finish_ms``): a worker's loads queue behind each
    other, and a plan that counts them as free piles them onto busy workers."""
    begin = np.maximum(ready, loader_free)
    # clipped to [0, load] by the ufuncs themselves: np.clip's dispatch costs more than
    # the arithmetic at 1,000 workers, and this runs for every task scored
    hidden = np.minimum(np.maximum(start - begin, 0.0), load)
    return np.where(fits & (load > 0), hidden, 0.0)


def _np_max(a: float, b: float) -> float:
    """``np.maximum`` of two floats, as numpy gives it: a NaN wins, ties give ``a``."""
    return a if a >= b or a != a else b


def _np_min(a: float, b: float) -> float:
    """``np.minimum`` of two floats, as numpy gives it: a NaN wins, ties give ``a``."""
    return a if a <= b or a != a else b


class Hidden:
    """:func:`hidden_load_ms` per worker, worked out for a worker when it is read.

    A choice reads only finishes (the whole load); the hidden part is read at the one
    worker chosen, for its placement, so working it out for every worker (seven passes
    over 1,000 elements per task scored) was spent on numbers nobody read. Indexing gives
    the value the array would hold, float for float (the same IEEE operations, numpy's
    NaN and tie rules); a value read or written is kept, so later changes to the columns
    it was made from (a forming batch rewrites ``start``) do not reach it, and writes
    (``hidden[i] = 0.0``) act as on the array. ``loader_free`` is copied: a plan's
    loader column changes as it commits."""

    __slots__ = ("_ready", "_start", "_load", "_fits", "_loader", "_got")

    def __init__(self, ready: np.ndarray | float, start: np.ndarray, load: np.ndarray,
                 fits: np.ndarray, loader_free: np.ndarray | float = 0.0,
                 zero: np.ndarray | None = None) -> None:
        self._ready, self._start, self._load, self._fits = ready, start, load, fits
        self._loader = loader_free.copy() if isinstance(loader_free, np.ndarray) \
            else loader_free
        self._got: dict[int, float] = {} if zero is None else dict.fromkeys(
            zero.tolist(), 0.0)

    def __getitem__(self, i: int) -> float:
        got = self._got.get(i)
        if got is None:
            got = self._got[i] = self._at(i)
        return got

    def __setitem__(self, i: int, value: float) -> None:
        self._got[i] = value

    def _at(self, i: int) -> float:
        ready, loader = self._ready, self._loader
        r = float(ready[i]) if isinstance(ready, np.ndarray) else float(ready)
        f = float(loader[i]) if isinstance(loader, np.ndarray) else float(loader)
        load = float(self._load[i])
        if not (self._fits[i] and load > 0):
            return 0.0
        return _np_min(_np_max(float(self._start[i]) - _np_max(r, f), 0.0), load)

    def sound(self) -> bool:
        """Whether a value can be NaN only where the task's start is (then so is its
        finish): the loader column it read holds no NaN."""
        loader = self._loader
        if isinstance(loader, np.ndarray):  # its sum of squares is NaN if one is NaN
            top = float(np.dot(loader, loader))  # (one BLAS dot: cheaper than a max)
            return top == top
        return loader == loader

    def array(self) -> np.ndarray:
        """Every worker's value (what :func:`hidden_load_ms` gives, with what was written)."""
        out = hidden_load_ms(self._ready, self._start, self._load, self._fits, self._loader)
        for i, v in self._got.items():
            out[i] = v
        return out


def load_terms(columns: tuple[np.ndarray, np.ndarray], size_mb: float, free_mb: np.ndarray,
               ready: np.ndarray | float, start: np.ndarray,
               loader_free: np.ndarray | float = 0.0,
               in_flight: Flight | None = None) -> tuple[np.ndarray, Hidden]:
    """Per worker: the model's load (``columns``: if it fits in free memory, if it must
    evict) and the part of it made while the task waits (:func:`hidden_load_ms`, worked
    out where it is read: :class:`Hidden`).

    Where the model is being loaded already (``in_flight``: worker index, ms left,
    ``WorkerArrays.in_flight``) the load runs on from now whatever the task does: it
    delays the start only by what is left of it then, and that is the whole load term
    there (nothing hidden to take off, nothing double-counted in the choice)."""
    fit, evict = columns
    fits = size_mb <= free_mb
    load = np.where(fits, fit, evict)  # == load_ms, from precomputed columns
    base = load  # what is hidden is made before the start: of the load as it was asked
    # (count_nonzero: the same answer as any(), NaN counted, without its wrapper)
    if isinstance(loader_free, np.ndarray) and np.count_nonzero(loader_free):
        # a load begins once the worker's loader is free: what of that falls after the
        # start delays the task too (hidden is then 0: nothing of it ran before the start)
        # at the few rows where it is (loader_free > start is behind > 0, float for
        # float: a difference of two doubles is above 0 exactly when the first is larger)
        rows = (loader_free > start).nonzero()[0]
        if len(rows):
            was = load[rows]
            load = load.copy()  # ``base`` keeps the load as asked
            load[rows] = np.where(was > 0.0, was + (loader_free[rows] - start[rows]), was)
    if in_flight is not None and len(in_flight.at):
        at = in_flight.at
        # the rewrite below changes the load only at ``at``, where nothing is hidden
        hidden = Hidden(ready, start, base, fits, loader_free, at)
        left = in_flight.left - start[at]
        load[at] = np.where(left < 0.0, 0.0, left)  # max(left, 0.0), float for float
        return load, hidden
    return load, Hidden(ready, start, base, fits, loader_free)


def finish_ms(start_ms: np.ndarray, load: np.ndarray, run: np.ndarray) -> np.ndarray:
    """ms from now until the task is done: start (worker free, inputs in) + load + run."""
    return start_ms + load + run


class Costs(NamedTuple):
    """One worker's estimate for one task, every field in ms."""

    ready: float
    wait: float
    load: float
    transfer: float
    run: float
    start: float
    finish: float


def scalar_costs(
    exec_ms: float,
    size_mb: float,
    worker: WorkerView,
    *,
    available_ms: float,
    free_mb: float,
    resident: bool,
    host_resident: bool,
    inputs: Sequence[tuple[float, str, float]] = (),
    loading: tuple[float, float] | None = None,
    now: float = 0.0,
    loader_free_ms: float = 0.0,
    queued_ms: float = 0.0,
) -> Costs:
    """Reference model for one worker; ``inputs`` = (pred finish ms, pred worker, KB);
    ``loading``, the span of a load of the model under way there (``WorkerView.loading``)
    seen at ``now``, ending no sooner than ``queued_ms`` (the loads queued ahead of it
    there and itself, ``WorkerArrays.loads_ahead``); ``loader_free_ms``, when the
    worker's loader is free (a new load begins no sooner)."""
    inputs_done = max((f for f, _, _ in inputs), default=0.0)
    total_kb = here_kb = 0.0
    for _, where, out_kb in inputs:
        total_kb += out_kb
        here_kb += out_kb if where == worker.name else 0.0
    transfer = (total_kb - here_kb) * (MS_PER_S / (KB_PER_MB * worker.net_mb_per_s))
    ready = inputs_done + transfer
    run = exec_ms / worker.speed
    start = max(available_ms, ready) + worker.hop_ms
    bw = worker.host_load_mb_per_s if host_resident else worker.load_mb_per_s
    whole = size_mb * (MS_PER_S / bw)
    if loading is not None:  # runs on from now: only what is left after the start delays
        load = max(max(whole * left_share(*loading, now), queued_ms) - start, 0.0)
    elif resident:
        load = 0.0
    else:
        load = whole * EVICTION_PENALTY if size_mb > free_mb else whole
        if load > 0.0 and loader_free_ms > start:  # it begins once the loader is free
            load += loader_free_ms - start
    return Costs(ready, start - ready, load, transfer, run, start, start + load + run)
