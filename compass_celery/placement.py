"""One placement decision for one task: snapshot + a task's needs -> queue, with the why.

Shared by the Celery router (Redis mode) and the eager hook (in-process state),
so both modes decide alike. Infrastructure trouble (state unavailable, no live
worker) yields a fallback decision to the shared queue; bad input (unknown
model, a model no GPU can hold) raises :class:`PlacementError`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from itertools import compress, count
from operator import is_not
from typing import Any

from .errors import CompassInputError
from .needs import TaskNeeds
from .planner import PlanningError
from .planner.base import Policy
from .planner.check import check_plan
from .planner.cost import evolve, remember_arrays, with_rows, worker_arrays
from .planner.demand import DemandSum
from .planner.types import SHARED, ClusterView, DagSpec, WorkerView
from .state.store import Snapshot


class PlacementError(CompassInputError):
    """The task cannot be placed as declared; the message names the problem."""


@dataclass(frozen=True)
class Decision:
    """Where a task goes and why; travels in the message's ``compass`` header."""

    task: str
    model: str | None
    worker: str
    queue: str
    policy: str
    charge_ms: float
    est_finish_ms: float = 0.0
    wait_ms: float = 0.0
    load_ms: float = 0.0
    run_ms: float = 0.0
    reason: str = ""
    fallback: bool = False

    def as_header(self) -> dict[str, Any]:
        """The decision as a plain dict, for the message's ``compass`` header."""
        return asdict(self)

    @classmethod
    def from_header(cls, body: Any) -> Decision | None:
        """The decision in a ``compass`` header; None if absent or malformed."""
        if not isinstance(body, dict):
            return None
        try:
            return cls(**{k: body[k] for k in cls.__dataclass_fields__ if k in body})
        except TypeError:
            return None


def fallback(needs: TaskNeeds, shared_queue: str, policy: str, why: str) -> Decision:
    """A decision for the shared queue, charging no worker, with ``why`` as its reason."""
    return Decision(task=needs.task, model=needs.model, worker=SHARED, queue=shared_queue,
                    policy=policy, charge_ms=0.0, run_ms=needs.exec_ms, reason=why,
                    fallback=True)


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
            now: float) -> ClusterView:
        """A view of ``workers`` equal to ``ClusterView.of(workers, model_sizes_mb, now,
        demand=cluster_demand(workers))`` (the demand up to float rounding)."""
        with self._lock:
            last = self._last
        carried = self._carry(last, workers, model_sizes_mb, now) if last is not None else None
        if carried is None:
            sums = DemandSum(workers)
            view = ClusterView.of(workers, model_sizes_mb, now, demand=sums.demand)
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


def cluster_view(snapshot: Snapshot, model_sizes_mb: Mapping[str, float]) -> ClusterView:
    """The planner's view of ``snapshot``, with the cluster's demand (the sum of the live
    workers' ``served``), carried over from the last one this process built."""
    return _VIEWS.get(snapshot.workers, model_sizes_mb, snapshot.taken_at)


def decide(needs: TaskNeeds, snapshot: Snapshot, policy: Policy,
           model_sizes_mb: Mapping[str, float], shared_queue: str,
           validate: bool = False) -> Decision:
    """Plan ``needs`` as a one-node DAG against ``snapshot`` with ``policy``."""
    if needs.model is not None and needs.model not in model_sizes_mb:
        raise PlacementError(f"task {needs.task!r} needs unknown model {needs.model!r}; "
                             f"known models: {sorted(model_sizes_mb)}")
    if not snapshot.workers:
        return fallback(needs, shared_queue, policy.name, "no live compass worker known")
    cluster = cluster_view(snapshot, model_sizes_mb)
    try:
        dag = DagSpec.single(needs.spec())
        plan = policy.plan(dag, cluster)
        if validate:
            check_plan(plan, dag, cluster)
    except PlanningError as exc:
        raise PlacementError(str(exc)) from None
    p = plan.placements[needs.task]
    if p.worker == SHARED:
        return Decision(task=needs.task, model=needs.model, worker=SHARED, queue=shared_queue,
                        policy=policy.name, charge_ms=0.0, est_finish_ms=p.finish_ms,
                        run_ms=p.run_ms, reason=p.reason or "shared queue")
    return Decision(task=needs.task, model=needs.model, worker=p.worker, queue=p.queue,
                    policy=policy.name, charge_ms=p.run_ms or needs.exec_ms,
                    est_finish_ms=p.finish_ms,
                    wait_ms=p.wait_ms, load_ms=p.load_ms, run_ms=p.run_ms, reason=p.reason)


# -- showing placement where Celery's own events reach (Flower) ------------------------
#: The job runtime's message header (its home is here, below the job modules, which
#: import it: ``job_keys.JOB_HEADER`` is this name).
JOB_HEADER = "compass_job"
#: Separates the task's own kwargs repr from the placement in ``kwargsrepr``.
REPR_MARK = " | compass: "
REASON_MAX = 120


def describe_placement(compass: Mapping[str, Any] | None,
                       job: Mapping[str, Any] | None = None) -> str:
    """One short line from a ``compass`` header (and the job header, for moves).

    Pure and forgiving: any field may be missing or odd (a header from an older
    producer), and the line still renders, with ``-`` for what is unknown.
    """
    c = compass if isinstance(compass, Mapping) else {}
    j = job if isinstance(job, Mapping) else {}
    worker = str(c.get("worker") or "-")
    if worker == SHARED:
        worker = "shared"
    parts = [f"worker={worker}"]
    if c.get("model"):
        parts.append(f"model={c['model']}")
    parts.append(f"policy={c.get('policy') or '-'}")
    try:
        parts.append(f"est_finish={float(c['est_finish_ms']):.0f}ms")
    except (KeyError, TypeError, ValueError):
        parts.append("est_finish=-")
    parts.append(f"moved_from={j.get('moved_from') or '-'}")
    if c.get("fallback"):
        parts.append("fallback=yes")
    reason = " ".join(str(c.get("reason") or "-").split())
    if len(reason) > REASON_MAX:
        reason = reason[:REASON_MAX - 3] + "..."
    parts.append(f"reason={reason}")
    return "compass: " + " ".join(parts)


def annotate_headers(headers: dict[str, Any]) -> None:
    """Put the placement into ``headers["kwargsrepr"]`` when a ``compass`` header is there.

    With message protocol 2 the worker's ``task-received`` event reports
    ``kwargsrepr`` as the task's kwargs, so Flower's task list, task page and REST
    API show the placement with no lookup of their own. The original repr stays in
    front; a placement from an earlier annotation (a re-placed retry) is replaced,
    not stacked. Without a ``compass`` header nothing changes.
    """
    if not isinstance(headers, dict) or not headers.get("compass"):
        return
    line = describe_placement(headers.get("compass"), headers.get(JOB_HEADER))
    original = headers.get("kwargsrepr")
    if not isinstance(original, str):
        headers["kwargsrepr"] = line
        return
    original = original.split(REPR_MARK, 1)[0]
    if original.startswith("compass: "):  # annotated earlier with no kwargs repr
        original = ""
    headers["kwargsrepr"] = f"{original} | {line}" if original else line
