"""One placement decision for one task: snapshot + demand -> queue, with the why.

Shared by the Celery router (Redis mode) and the eager hook (in-process state),
so both modes decide alike. Infrastructure trouble (state unavailable, no live
worker) yields a fallback decision to the shared queue; bad input (unknown
model, a model no GPU can hold) raises :class:`PlacementError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .errors import CompassInputError
from .planner import PlanningError
from .planner.base import Policy
from .planner.check import check_plan
from .planner.types import SHARED, ClusterView, DagSpec
from .profiles import Demand
from .state import Snapshot


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
        return asdict(self)

    @classmethod
    def from_header(cls, body: Any) -> Decision | None:
        if not isinstance(body, dict):
            return None
        try:
            return cls(**{k: body[k] for k in cls.__dataclass_fields__ if k in body})
        except TypeError:
            return None


def fallback(demand: Demand, shared_queue: str, policy: str, why: str) -> Decision:
    return Decision(task=demand.task, model=demand.model, worker=SHARED, queue=shared_queue,
                    policy=policy, charge_ms=0.0, run_ms=demand.exec_ms, reason=why,
                    fallback=True)


def decide(demand: Demand, snapshot: Snapshot, policy: Policy,
           model_sizes_mb: Mapping[str, float], shared_queue: str,
           validate: bool = False) -> Decision:
    """Plan ``demand`` as a one-node DAG against ``snapshot`` with ``policy``."""
    if demand.model is not None and demand.model not in model_sizes_mb:
        raise PlacementError(f"task {demand.task!r} needs unknown model {demand.model!r}; "
                             f"known models: {sorted(model_sizes_mb)}")
    if not snapshot.workers:
        return fallback(demand, shared_queue, policy.name, "no live compass worker known")
    cluster = ClusterView.of(snapshot.workers, model_sizes_mb, snapshot.taken_at)
    try:
        dag = DagSpec.single(demand.spec())
        plan = policy.plan(dag, cluster)
        if validate:
            check_plan(plan, dag, cluster)
    except PlanningError as exc:
        raise PlacementError(str(exc)) from None
    p = plan.placements[demand.task]
    if p.worker == SHARED:
        return Decision(task=demand.task, model=demand.model, worker=SHARED, queue=shared_queue,
                        policy=policy.name, charge_ms=0.0, est_finish_ms=p.finish_ms,
                        run_ms=p.run_ms, reason=p.reason or "shared queue")
    return Decision(task=demand.task, model=demand.model, worker=p.worker, queue=p.queue,
                    policy=policy.name, charge_ms=p.run_ms or demand.exec_ms,
                    est_finish_ms=p.finish_ms,
                    wait_ms=p.wait_ms, load_ms=p.load_ms, run_ms=p.run_ms, reason=p.reason)
