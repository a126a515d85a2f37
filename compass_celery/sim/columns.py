"""The planner's per-worker columns, kept live as simulated workers change.

The planner builds its numpy columns from a snapshot with one Python pass over every
worker. A router that has just read fresh state must pay that; the simulator need not:
it knows which workers changed since the last snapshot, so it updates only their rows
here and hands each new snapshot a copy (``planner.cost.remember_arrays``). That turns
a per-job O(workers) Python pass into O(changed workers) plus a few numpy copies.
The copy is what :func:`~compass_celery.planner.cost.build_worker_arrays` would build
from the same views, bit for bit (a test holds it to that); the memos of what it derives
from columns that did not change are handed on with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..planner.cost import KB_PER_MB, MIN_SPAN, MS_PER_S, WorkerArrays, evolve
from ..planner.types import WorkerView


class LiveColumns:
    """Columns for workers in a fixed order; :meth:`update` rewrites one row."""

    def __init__(self, views: Sequence[WorkerView], sizes: Mapping[str, float]) -> None:
        n = len(views)
        self.names = tuple(v.name for v in views)
        self.queues = tuple(v.queue for v in views)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.models = {m: j for j, m in enumerate(sizes)}  # catalogue order, as the planner
        col = lambda attr: np.fromiter((getattr(v, attr) for v in views), float, n)  # noqa: E731
        # fixed for a worker's lifetime
        self.speed = col("speed")
        self.gpu_total_mb = col("gpu_total_mb")
        self.load_mb_per_s = col("load_mb_per_s")
        self.host_load_mb_per_s = col("host_load_mb_per_s")
        self.net_mb_per_s = col("net_mb_per_s")
        self.hop_ms = col("hop_ms")
        self.positions = np.arange(n)
        self.ms_per_kb = MS_PER_S / (KB_PER_MB * self.net_mb_per_s)
        self.ms_per_mb = MS_PER_S / self.load_mb_per_s
        self.host_ms_per_mb = MS_PER_S / self.host_load_mb_per_s
        # changing: rewritten row by row
        self.backlog_ms = np.zeros(n)
        self.pending_ms = np.zeros(n)
        self.gpu_free_mb = np.zeros(n)
        self.resident = np.zeros((n, len(self.models)), dtype=bool)
        self.host_resident = np.zeros((n, len(self.models)), dtype=bool)
        self.loading: dict[int, Mapping[str, tuple[float, float]]] = {}  # rows loading now
        # what each row runs now (a simulated worker runs one task, or one batched pass)
        self.run = np.zeros((3, n, 1))  # began, ends, charge
        self.rate = np.zeros((n, 1))  # each row's ``run_rate``, written with its span
        self._spans: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * n  # as in run
        self._busy: set[int] = set()  # rows with a charge running
        self._idle = tuple(np.zeros((3, n, 0)))  # the run columns while nothing runs
        # the frozen run columns the last ``arrays`` handed out and their rates
        # (``planner.cost.run_rate``), shared until a row's span changes
        self._ran: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        # each row's sets as last written, and the frozen copies of the matrices (and
        # host_models) the last ``arrays`` handed out, shared until a set changes
        self._sets: list[tuple[frozenset[str], frozenset[str]] | None] = [None] * n
        self._frozen: tuple[np.ndarray, np.ndarray, list[bool]] | None = None
        # the planner's per-snapshot memos that read only what stays put between
        # snapshots, shared by them: fits by capacity (fixed), load columns while the
        # frozen matrices are shared, means of the fixed columns
        self._fits: dict[float, np.ndarray] = {}
        self._some: dict[float, bool] = {}
        self._fetch: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._means = FixedMeans(FIXED_COLUMNS)
        # the copy of ``loading`` the last ``arrays`` handed out, shared until a row's
        # loads change (the planner's in-flight memos go by its identity), and the
        # memos that read only it: ``WorkerArrays._spans`` and ``_flights``
        self._handed: tuple[dict[int, Mapping[str, tuple[float, float]]], dict[str, Any],
                            dict[str, Any]] | None = None
        # ``WorkerArrays._ahead`` (``loads_ahead``'s rows and last answer), shared while
        # both what it reads are: the copy of ``loading`` and the load columns (``_fetch``)
        self._ahead: dict[str, tuple[Any, ...]] = {}
        self._last: WorkerArrays | None = None
        for i, v in enumerate(views):
            self.update(i, v)

    def update(self, i: int, view: WorkerView) -> None:
        """Row ``i`` from the worker's current view (the same view the snapshot holds)."""
        self.update_row(i, view.backlog_ms, view.pending_ms, view, view.running)

    def update_row(self, i: int, backlog_ms: float, pending_ms: float, memory: WorkerView,
                   running: tuple[tuple[float, float, float], ...]) -> None:
        """Row ``i`` from the fields of a worker's record these columns read, without the
        record (``SimWorker.record_parts``: building each changed worker's whole record
        for every snapshot cost half the snapshot); ``memory`` is a record whose memory
        fields (free memory, resident and host sets, loads under way) are the worker's."""
        view = memory
        self.backlog_ms[i] = backlog_ms
        self.pending_ms[i] = pending_ms
        self.gpu_free_mb[i] = view.gpu_free_mb
        sets = self._sets[i]
        # successive views of a worker share its sets until they change (``SimWorker.view``)
        if sets is None or (sets[0] is not view.resident and sets[0] != view.resident) or (
                sets[1] is not view.host_resident and sets[1] != view.host_resident):
            self._sets[i] = (view.resident, view.host_resident)
            self._members(self.resident[i], view.resident)
            self._members(self.host_resident[i], view.host_resident)
            self._frozen = None
        if view.loading:
            was = self.loading.get(i)
            if was is not view.loading and was != view.loading:
                self.loading[i] = view.loading
                self._handed = None
        elif self.loading.pop(i, None) is not None:
            self._handed = None
        assert len(running) <= 1, "a simulated worker runs one task at a time"
        span = running[0] if running else (0.0, 0.0, 0.0)
        if span[2] <= 0:
            span = (0.0, 0.0, 0.0)
        if span != self._spans[i]:  # most updates change the backlog, not what runs
            self._spans[i] = span
            self.run[:, i, 0] = span
            self.rate[i, 0] = _rate(*span)
            self._ran = None
            if span[2] > 0:
                self._busy.add(i)
            else:
                self._busy.discard(i)

    def _members(self, row: np.ndarray, names: frozenset[str]) -> None:
        row[:] = False
        for m in names:
            j = self.models.get(m)
            if j is not None:
                row[j] = True

    def arrays(self) -> WorkerArrays:
        """A frozen copy for one snapshot: later updates do not reach it. The membership
        matrices are copied only when a row's sets changed since the last call (most
        snapshots differ by backlog charges); until then snapshots share one copy."""
        if self._frozen is None:
            host = self.host_resident.copy()
            resident = self.resident.copy()
            resident.flags.writeable = host.flags.writeable = False  # shared: copy to change
            self._frozen = (resident, host, host.any(axis=0).tolist())
            self._fetch = {}
            self._ahead = {}
        resident, host, host_models = self._frozen
        began, ends, charge, left = self._run_columns()
        if self._handed is None:
            self._handed = (dict(self.loading), {}, {})
            self._ahead = {}
        loading, spans, flights = self._handed
        changing = dict(
            backlog_ms=self.backlog_ms.copy(), pending_ms=self.pending_ms.copy(),
            gpu_free_mb=self.gpu_free_mb.copy(),
            resident=resident, host_resident=host, host_models=host_models,
            loading=loading, _fetch=self._fetch, run_began=began, run_ends=ends,
            run_charge=charge, _left=left, _spans=spans, _flights=flights, _ahead=self._ahead)
        if self._last is not None:  # the fixed fields as last time: no constructor pass
            self._last = evolve(self._last, **changing)
            return self._last
        self._last = WorkerArrays(
            names=self.names, queues=self.queues, index=self.index,
            speed=self.speed, gpu_total_mb=self.gpu_total_mb,
            load_mb_per_s=self.load_mb_per_s,
            host_load_mb_per_s=self.host_load_mb_per_s, net_mb_per_s=self.net_mb_per_s,
            hop_ms=self.hop_ms, positions=self.positions, ms_per_kb=self.ms_per_kb,
            ms_per_mb=self.ms_per_mb,
            host_ms_per_mb=self.host_ms_per_mb, models=self.models,
            _fits=self._fits, _some=self._some, _means=self._means, **changing)
        return self._last

    def _run_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                    dict[float | None, np.ndarray]]:
        """The run columns for a snapshot and a new ``_left`` memo holding their rates:
        frozen copies shared by the snapshots until a row's span changes (most differ by
        backlog charges), so the rates are worked out once per change of what runs."""
        if not self._busy:
            return (*self._idle, {})
        if self._ran is None:  # the rates kept row by row: two copies, no pass
            began, ends, charge = self.run.copy()
            rate = self.rate.copy()
            for col in (began, ends, charge, rate):
                col.flags.writeable = False
            self._ran = (began, ends, charge, rate)
        began, ends, charge, rate = self._ran
        return began, ends, charge, {None: rate}


def _rate(began: float, ends: float, charge: float) -> float:
    """``planner.cost.run_rate`` of one span in Python floats, float for float (the
    maximum as ``np.maximum`` takes it: a NaN span stays NaN)."""
    span = ends - began
    return charge / (span if span >= MIN_SPAN or span != span else MIN_SPAN)


#: The columns of :class:`LiveColumns` fixed for a worker's lifetime (and ``WorkerArrays``'
#: derived ones): a mean of one is the same for every snapshot.
FIXED_COLUMNS = frozenset({
    "speed", "gpu_total_mb", "load_mb_per_s", "host_load_mb_per_s", "net_mb_per_s",
    "hop_ms", "ms_per_kb", "ms_per_mb", "host_ms_per_mb"})


class FixedMeans(dict[tuple[str, bool], float]):
    """``WorkerArrays``' memo of column means, shared by successive snapshots: it keeps
    only the means of ``fixed`` columns (a changing column's is worked out each time)."""

    def __init__(self, fixed: frozenset[str]) -> None:
        super().__init__()
        self.fixed = fixed

    def __setitem__(self, key: tuple[str, bool], value: float) -> None:
        if key[0] in self.fixed:
            super().__setitem__(key, value)
