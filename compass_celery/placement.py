"""One placement decision for one task: snapshot + a task's needs -> queue, with the why.

Shared by the Celery router (Redis mode) and the eager hook (in-process state),
so both modes decide alike. Infrastructure trouble (state unavailable, no live
worker) yields a fallback decision to the shared queue; bad input (unknown
model, a model no GPU can hold) raises :class:`PlacementError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import CompassInputError
from .needs import DECLARE_MODEL, TaskNeeds
from .planner import PlanningError
from .planner.base import Policy
from .planner.check import check_plan
from .planner.compass import plan_job
from .planner.pending import send_charge_ms
from .planner.priority import race_clock
from .planner.types import SHARED, DagSpec, ModelDemand
from .state.store import Snapshot
from .state.views import planning_view


class PlacementError(CompassInputError):
    """The task cannot be placed as declared; the message names the problem."""


#: The version of the ``compass`` header this code writes. A header of another version is
#: read by field name (what both know survives a rolling deploy); one with none is 1.
HEADER_VERSION = 2

#: The fields that belong to the task, not to where it was placed: a re-placement (a
#: hand-back, a drain, a restart's take-back, a retry) carries them over unchanged.
CARRIED = ("task", "model", "exec_ms", "priority", "queued_at", "slo", "due", "expires_at",
           "late", "batch")


@dataclass(frozen=True)
class Decision:
    """Where a task goes and why: the one envelope every compass message carries in its
    ``compass`` header, written by :meth:`as_header` and read by :meth:`from_header` only.

    The first fields say where it was placed (and are redone by a re-placement); those in
    :data:`CARRIED` belong to the task and survive every re-placement whole."""

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
    #: Priority level 0..9 (9 most urgent, whatever the broker); None: sent before
    #: compass knew priorities.
    priority: int | None = None
    #: When it was placed (the sender's clock): the ageing rule's start.
    queued_at: float = 0.0
    #: Its SLO class ('' none), and when its answer is due (epoch s; 0: no deadline).
    slo: str = ""
    due: float = 0.0
    #: After this (epoch s; 0: never) starting it cannot meet the deadline: the message
    #: carries it as Celery's ``expires``, so a worker drops it unrun.
    expires_at: float = 0.0
    #: Admitted although the plan said it would miss its deadline.
    late: bool = False
    #: A batched task's batch key (``planner.batch``): its worker counts it among the
    #: inputs of that key waiting there until it starts. '' when unbatched.
    batch: str = ""
    #: Its run time at speed 1.0 (``run_ms`` is on the chosen worker, its speed applied):
    #: what a re-placement plans with, so a worker's speed is applied once.
    exec_ms: float = 0.0
    #: The header's version (:data:`HEADER_VERSION`).
    v: int = HEADER_VERSION

    def as_header(self) -> dict[str, Any]:
        """The decision as a plain dict, for the message's ``compass`` header. Every field
        is a plain value, so a shallow copy is the whole of it (``asdict`` deep-copies each
        one, a cost paid on every successor a worker sends). The instance's ``__dict__``
        holds exactly the fields, in order (``__init__`` and ``planner.cost.evolve`` alike
        write nothing else): copying it costs a tenth of reading each field by name."""
        return self.__dict__.copy()

    @classmethod
    def from_header(cls, body: Any) -> Decision | None:
        """The decision in a ``compass`` header; None if absent or malformed."""
        if not isinstance(body, dict):
            return None
        names = cls.__dataclass_fields__
        if body.keys() >= names.keys():  # this version's header (every worker reads one
            # per task): its fields as they are, without the constructor's 21 arguments
            new = object.__new__(cls)
            new.__dict__.update({k: body[k] for k in names})
            return new
        try:
            return cls(**{k: body[k] for k in names if k in body})
        except TypeError:
            return None

    @property
    def planned_exec_ms(self) -> float:
        """The speed-1.0 run time to plan it again with (a version 1 header, written
        before ``exec_ms`` was carried, has only ``run_ms``)."""
        return self.exec_ms or self.run_ms

    def replaced(self, placed: Decision) -> Decision:
        """``placed`` (a new placement of this task) carrying this task's own fields
        (:data:`CARRIED`): its level, age, SLO class, due time, latest start, batch key."""
        return replace(placed, **{name: getattr(self, name) for name in CARRIED})


def fallback(needs: TaskNeeds, shared_queue: str, policy: str, why: str) -> Decision:
    """A decision for the shared queue, charging no worker, with ``why`` as its reason."""
    return Decision(task=needs.task, model=needs.model, worker=SHARED, queue=shared_queue,
                    policy=policy, charge_ms=0.0, run_ms=needs.exec_ms, reason=why,
                    fallback=True, exec_ms=needs.exec_ms)


def decide(needs: TaskNeeds, snapshot: Snapshot, policy: Policy,
           model_sizes_mb: Mapping[str, float], shared_queue: str,
           validate: bool = False, priority: int | None = None,
           batch_aware: bool = True, budget_ms: float | None = None,
           refused: Mapping[str, ModelDemand] | None = None,
           hold_max_ms: float = 0.0) -> Decision:
    """Plan ``needs`` as a one-node DAG against ``snapshot`` with ``policy``; a task of
    ``priority`` waits only for work in flight and queued at its level or above. A
    batched task joins a batch forming on a worker where that finishes first, and is
    charged what it adds to it (``batch_aware`` off: placed as an unbatched task).
    ``budget_ms``: the task's deadline budget (``planner.admission.plan_budget_ms``), for
    a policy that makes copies against it (``planner.compass.plan_job``); ``refused``:
    demand this process refused, planned on with what the workers served; ``hold_max_ms``:
    the workers' held slot, which decides whether a worker about to take a lower-level
    task first is priced (``planner.priority.race_clock``)."""
    if needs.model is not None and needs.model not in model_sizes_mb:
        raise PlacementError(f"task {needs.task!r} needs unknown model {needs.model!r}; "
                             f"known models: {sorted(model_sizes_mb)}; {DECLARE_MODEL}")
    if not snapshot.workers:
        return fallback(needs, shared_queue, policy.name, "no live compass worker known")
    # as this level sees it (what it would overtake, and a worker about to take a
    # lower-level task first), carried over: only the rows that changed seen again
    cluster = planning_view(snapshot, model_sizes_mb, priority,
                            race_clock(snapshot.taken_at, hold_max_ms), refused)
    try:
        dag = DagSpec.single(needs.spec(batch_aware))
        plan = plan_job(policy, dag, cluster, budget_ms)
        if validate:
            check_plan(plan, dag, cluster)
    except PlanningError as exc:
        raise PlacementError(str(exc)) from None
    p = plan.placements[needs.task]
    if p.worker == SHARED:
        return Decision(task=needs.task, model=needs.model, worker=SHARED, queue=shared_queue,
                        policy=policy.name, charge_ms=0.0, est_finish_ms=p.finish_ms,
                        run_ms=p.run_ms, reason=p.reason or "shared queue",
                        exec_ms=needs.exec_ms)
    charge = p.charge_ms if p.charge_ms is not None \
        else send_charge_ms(p.run_ms or needs.exec_ms, p.hop_ms)
    return Decision(task=needs.task, model=needs.model, worker=p.worker, queue=p.queue,
                    policy=policy.name, charge_ms=charge, est_finish_ms=p.finish_ms,
                    wait_ms=p.wait_ms, load_ms=p.load_ms, run_ms=p.run_ms, reason=p.reason,
                    priority=priority, batch=needs.batch_key, exec_ms=needs.exec_ms)
