"""Deadlines, SLO classes and admission: whether a job is taken, and until when it is
worth starting.

The planner predicts every node's finish, so a job's fate is known at submission:
its predicted finish against its deadline. :func:`judge` turns that into a
:class:`Verdict` (admit, admit late, or reject, saying by how much and when
capacity frees up), the same function for the router, a Dag submission, the
benchmark and the simulator. A job that is admitted may still fall behind (a
prediction is not a promise); :func:`latest_start` gives each node the time after
which starting it cannot meet the deadline, so a worker drops it before spending
anything on it (:func:`should_shed`).

Pure: no I/O, no Celery. Times are workload milliseconds, as everywhere in the
planner; ``time_scale`` (real seconds per workload second) converts to wall time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .demand import replica_targets
from .types import SHARED, ClusterView, ModelDemand, Placement, WorkerView

#: What happens to a job predicted to miss its deadline.
REJECT, LATE, DEGRADE = "reject", "late", "degrade"
ON_MISS = (REJECT, LATE, DEGRADE)

#: The classes every app knows (``compass_slo_classes`` adds to or overrides them):
#: a click waits at most 400 ms or is refused at once; batch work has no deadline.
DEFAULT_SLO_CLASSES: dict[str, dict[str, Any]] = {
    "interactive": {"deadline_ms": 400.0, "on_miss": REJECT, "priority": "interactive"},
    "batch": {"deadline_ms": None, "on_miss": LATE, "priority": "batch"},
}


#: The share of a deadline admission keeps in reserve: a job is taken when its plan
#: finishes within ``(1 - headroom) x deadline``. A plan is a prediction, and it is
#: hopeful under overload (a successor is queued only when its inputs are ready, behind
#: the first tasks of jobs that came later; each task pays a hop the plan does not
#: count); the headroom absorbs that error, so what is admitted meets its deadline.
DEFAULT_HEADROOM = 0.1

#: A plan that starts within this share of the deadline has an idle worker to itself: a
#: miss then caused only by a model load is capacity being added, not lacking.
IDLE_SHARE = 0.05

#: Admission also learns how late its plans run (:func:`plan_error_step`): the quantile
#: of (measured - predicted) job finish it tracks, and the least step (ms) of each update.
ERROR_QUANTILE, ERROR_STEP_MS = 0.95, 4.0

#: Each update's step is this share of the class's deadline (at least ``ERROR_STEP_MS``):
#: 4 ms up to an 800 ms class, 7.5 ms for a 1,500 ms one. A fixed step learns an error
#: proportional to the deadline proportionally slower: at 4 ms a step, a 1,500 ms class
#: whose plans ran 450 ms late took over a hundred late jobs to learn it, and admitted
#: jobs it then shed meanwhile (docs/results/mixed/real-mixed.txt). A larger share
#: learns faster still but wanders further: 1% refused 15 of 262 interactive jobs the
#: simulator (whose plans are nearly exact) admitted at 0.5%.
ERROR_STEP_SHARE = 0.005

#: The learned plan error a job is charged is at most this share of its deadline.
#: Overload can teach admission that plans run later than the deadline itself; charged
#: in full, every job of the class would be refused, none would end, and the error
#: (learned only from jobs that end) would stay there for good. Capped, a job whose
#: plan is short is still taken (and shed if it falls behind), and its end teaches.
ERROR_CAP_SHARE = 0.5


#: Why admission refuses, as refusals are counted: the plan misses the deadline
#: (``deadline``), more work is queued ahead than ``compass_max_queue_ms`` allows
#: (``queue_full``), or it would be on time but for the model loads it plans, with no
#: worker that could take them late (``cold``: no copy where there is room for the job).
REFUSAL_CAUSES = ("deadline", "queue_full", "cold")


class SloError(ValueError):
    """An SLO class or deadline that makes no sense; the message names it."""


@dataclass(frozen=True)
class Slo:
    """A job's service objective: its deadline from submission, what to do when the
    plan says it will be missed, and the priority its nodes take by default."""

    name: str = ""
    deadline_ms: float | None = None
    on_miss: str = REJECT
    priority: int | str | None = None

    @property
    def sheds(self) -> bool:
        """Whether work that can no longer meet the deadline is dropped (a late job is
        run to the end: its caller asked for the answer however late)."""
        return self.deadline_ms is not None and self.on_miss != LATE


def slo_class(name: str, body: Any) -> Slo:
    """One entry of ``compass_slo_classes`` as an :class:`Slo`; a bad field raises
    :class:`SloError` naming the class and the field."""
    if not isinstance(body, Mapping):
        raise SloError(f"SLO class {name!r} must be a mapping with deadline_ms, on_miss "
                       f"and priority, got {body!r}")
    unknown = set(body) - {"deadline_ms", "on_miss", "priority"}
    if unknown:
        raise SloError(f"SLO class {name!r}: unknown fields {sorted(unknown)}; it may set "
                       "deadline_ms, on_miss and priority")
    return Slo(name, check_deadline(body.get("deadline_ms"), f"SLO class {name!r}"),
               check_on_miss(body.get("on_miss", REJECT), f"SLO class {name!r}"),
               body.get("priority"))


def check_deadline(value: Any, what: str) -> float | None:
    """A deadline in ms (> 0) or None; anything else raises :class:`SloError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise SloError(f"{what}: deadline_ms must be a number of milliseconds > 0, "
                       f"got {value!r}")
    return float(value)


def check_on_miss(value: Any, what: str) -> str:
    """One of :data:`ON_MISS`; anything else raises :class:`SloError`."""
    if value not in ON_MISS:
        raise SloError(f"{what}: on_miss must be one of {', '.join(ON_MISS)}, got {value!r}")
    return str(value)


def resolve_slo(slo: str | None, deadline_ms: Any, classes: Mapping[str, Any],
                on_miss: str | None = None) -> Slo | None:
    """A caller's ``slo=`` (a class name) and ``deadline_ms=`` as one :class:`Slo`: the
    class's, with an explicit deadline (and ``on_miss``) winning; None when neither is
    given (no deadline: admission has nothing to judge)."""
    if slo is None and deadline_ms is None:
        return None
    base = Slo()
    if slo is not None:
        table = {**DEFAULT_SLO_CLASSES, **classes}
        if slo not in table:
            raise SloError(f"unknown SLO class {slo!r}; known: {', '.join(sorted(table))} "
                           "(compass_slo_classes adds more)")
        base = slo_class(slo, table[slo])
    deadline = check_deadline(deadline_ms, "deadline") if deadline_ms is not None \
        else base.deadline_ms
    miss = check_on_miss(on_miss, "on_miss") if on_miss is not None else base.on_miss
    return Slo(base.name, deadline, miss, base.priority)


@dataclass(frozen=True)
class Verdict:
    """Admission's answer for one job (or task): taken or not, and why, with the numbers
    a caller (or an HTTP 429) needs."""

    admitted: bool
    #: Taken although the plan says it will miss its deadline (``on_miss='late'``, or
    #: admission turned off).
    late: bool = False
    predicted_ms: float = math.nan
    deadline_ms: float | None = None
    #: By how much the predicted finish misses the deadline (0 when it does not).
    miss_ms: float = 0.0
    #: How long until the capacity it lacks frees up (the backlog drains by ``miss_ms``).
    retry_after_ms: float = 0.0
    reason: str = ""
    #: Why it was refused or marked late: ``deadline``, ``queue_full`` or ``cold`` (late
    #: only because it loads models: run to the end, never shed); '' when on time.
    kind: str = ""
    #: Why it was refused, as refusals are counted per SLO class (``compass status``,
    #: Prometheus, the simulator's results): one of :data:`REFUSAL_CAUSES`; '' when taken.
    cause: str = ""

    @property
    def sheds(self) -> bool:
        """Whether the admitted job may be dropped once it falls behind: only one taken as
        on time. A job taken late (its class asks for the answer however late, admission
        is off, or it loads a model onto an idle worker) runs to the end: dropping it for
        a miss it was taken with would only waste the work, and a cold one would leave
        its model unloaded for good."""
        return self.admitted and not self.late


def judge(slo: Slo | None, predicted_ms: float, wait_ms: float = 0.0, *,
          max_queue_ms: float | None = None, admission: bool = True,
          load_ms: float = 0.0, headroom: float = 0.0, error_ms: float = 0.0,
          guessed: bool = False, missing: bool = False) -> Verdict:
    """Admit, admit late, or reject a job whose plan finishes at ``predicted_ms`` (from
    now; NaN when it could not be planned) and starts after ``wait_ms`` of queued work.

    A queue bound (``max_queue_ms``, seconds of work ahead rather than messages) applies
    to every job; a deadline, only to jobs that have one. A job the plan cannot predict
    (no live worker) is admitted: nothing says it will miss. ``headroom`` (a share of
    the deadline, see :data:`DEFAULT_HEADROOM`) is kept in reserve: the plan must finish
    within ``(1 - headroom) x deadline``, after adding ``error_ms``, how late plans have
    been running (the learned quantile of :func:`plan_error_step`; never negative here,
    and at most :data:`ERROR_CAP_SHARE` of the deadline).

    A job that misses only because its plan loads models (``load_ms``, the loads it
    plans: without them it would meet its target) is taken late (``kind='cold'``) and
    run to the end, not refused, when it loads onto an idle worker (``wait_ms`` within
    :data:`IDLE_SHARE` of the deadline) or loads a copy the model lacks: none is held, or
    fewer than its demand needs (``missing``, :func:`job_missing`). A load is how the
    cluster gains capacity for a model:
    refusing it would leave the model where it is (or nowhere, at a cold start, or
    after batch work evicted it), and every later job needing it refused too, for good,
    whenever the deadline is shorter than the load. A missing model is loaded on a busy
    worker too: the plan's wait counts only what runs ahead of the job's level (in
    flight, and queued at its level or above), so the worker it chose takes the load
    next, ahead of its queued lower-level work (past capacity, the one whose in-flight
    batch task ends soonest). A model with the copies its demand needs is not loaded late
    onto a busy worker, and a job that would miss even without its loads lacks capacity,
    and is refused.

    Likewise a plan that rests on a run time nobody declared and none was measured yet
    (``guessed``: ``compass_default_exec_ms`` stood in) is no evidence of a miss: on an
    idle worker the job is taken late (``kind='unlearned'``), so that its run is
    measured. Refused instead, a task without a declared run time under a deadline
    shorter than the default would never run, and never be learned."""
    deadline = slo.deadline_ms if slo is not None else None
    if admission and max_queue_ms is not None and wait_ms > max_queue_ms:
        return Verdict(False, predicted_ms=predicted_ms, deadline_ms=deadline,
                       retry_after_ms=wait_ms - max_queue_ms, kind="queue_full",
                       cause="queue_full",
                       reason=f"queue full: {wait_ms:.0f} ms of work ahead, over the "
                              f"bound of {max_queue_ms:.0f} ms")
    if deadline is None or math.isnan(predicted_ms):
        return Verdict(True, predicted_ms=predicted_ms, deadline_ms=deadline)
    target = deadline * (1.0 - headroom)
    predicted_ms = predicted_ms + min(max(0.0, error_ms), ERROR_CAP_SHARE * deadline)
    miss = predicted_ms - target
    if miss <= 0:
        return Verdict(True, predicted_ms=predicted_ms, deadline_ms=deadline)
    why = (f"predicted to finish in {predicted_ms:.0f} ms, {miss:.0f} ms past its "
           f"{deadline:.0f} ms deadline" + (f" less {headroom:.0%} headroom" if headroom
                                            else ""))
    if not admission or slo is None or slo.on_miss == LATE:
        return Verdict(True, late=True, predicted_ms=predicted_ms, deadline_ms=deadline,
                       miss_ms=miss, reason=why, kind="deadline")
    if load_ms > 0 and predicted_ms - load_ms <= target \
            and (missing or wait_ms <= IDLE_SHARE * deadline):
        return Verdict(True, late=True, predicted_ms=predicted_ms, deadline_ms=deadline,
                       miss_ms=miss, kind="cold",
                       reason=why + f", only because it loads {load_ms:.0f} ms of models: "
                                    "taken late, so that they load")
    if guessed and wait_ms <= IDLE_SHARE * deadline:
        return Verdict(True, late=True, predicted_ms=predicted_ms, deadline_ms=deadline,
                       miss_ms=miss, kind="unlearned",
                       reason=why + ", on a run time nobody declared and none measured "
                                    "yet: taken late, so that it is learned")
    cold = load_ms > 0 and predicted_ms - load_ms <= target  # on time but for its loads
    return Verdict(False, predicted_ms=predicted_ms, deadline_ms=deadline, miss_ms=miss,
                   retry_after_ms=miss, reason=why, kind="deadline",
                   cause="cold" if cold else "deadline")


def plan_budget_ms(slo: Slo | None, headroom: float = 0.0, error_ms: float = 0.0
                   ) -> float | None:
    """The time a plan of a job with ``slo`` should end within, ms from now: what
    :func:`judge` admits on time (the deadline less ``headroom`` and the learned plan
    error, capped as there); None without a deadline (a batch plan). The planner makes
    a model's copies against it (``planner.compass.copy_worker``)."""
    if slo is None or slo.deadline_ms is None:
        return None
    deadline = slo.deadline_ms
    return deadline * (1.0 - headroom) - min(max(0.0, error_ms), ERROR_CAP_SHARE * deadline)


def plan_error_step(q: float, error_ms: float, tau: float = ERROR_QUANTILE,
                    step_ms: float = ERROR_STEP_MS) -> float:
    """One update of the learned quantile ``q`` of a plan's error (measured minus
    predicted job finish, ms): up by ``tau x step`` when a job ran later than ``q``,
    down by ``(1 - tau) x step`` otherwise, so that ``q`` settles where a share ``tau``
    of jobs are within it. The one definition: both state stores apply it
    (state/records.py), the simulator too."""
    return q + step_ms * (tau if error_ms > q else tau - 1.0)


def error_step_ms(deadline_ms: float | None) -> float:
    """The step of :func:`plan_error_step` for a class with this deadline (ms; None or
    0: :data:`ERROR_STEP_MS`): :data:`ERROR_STEP_SHARE` of it, at least ERROR_STEP_MS."""
    return max(ERROR_STEP_MS, ERROR_STEP_SHARE * float(deadline_ms or 0.0))


def job_finish_ms(plan: Mapping[str, Placement]) -> float:
    """When a planned job finishes, from now (its last node's finish); NaN when any node
    went to the shared queue or nothing was planned (no live worker: no prediction)."""
    if not plan or any(p.worker == SHARED for p in plan.values()):
        return math.nan
    return max(p.finish_ms for p in plan.values())


def job_load_ms(plan: Mapping[str, Placement]) -> float:
    """The model loads a planned job makes (their sum: an upper bound on what they add
    to its finish)."""
    return sum(p.load_ms for p in plan.values())


def load_wanted(model: str, workers: Iterable[WorkerView],
                demand: Mapping[str, ModelDemand]) -> bool:
    """Whether a load of ``model`` adds a copy it lacks: no worker holds it (or is
    loading it), or fewer do than its demand's replica target (``demand.replica_targets``;
    demand counts refusals). Such a load is taken late on a busy worker (:func:`judge`)."""
    held = sum(1 for w in workers if model in w.resident or model in w.loading)
    d = demand.get(model)
    target = replica_targets({model: d}).get(model, 0) if d is not None else 0
    return held < max(1, target)


def job_missing(plan: Mapping[str, Placement], models: Mapping[str, str | None],
                cluster: ClusterView) -> bool:
    """Whether the plan loads a model (``models``: node -> model) that lacks a copy
    (:func:`load_wanted`): only a late load brings it (:func:`judge`)."""
    return any(p.load_ms > 0 and (m := models.get(n)) is not None
               and load_wanted(m, cluster.workers, cluster.demand) for n, p in plan.items())


def job_wait_ms(plan: Mapping[str, Placement]) -> float:
    """The queued work a planned job waits for before its first node starts (a later
    node's own wait counts from its inputs, so the first start is the job's wait)."""
    return min((p.start_ms for p in plan.values()), default=0.0)


def tails_ms(plan: Mapping[str, Placement]) -> dict[str, float]:
    """Per node, the planned time from its start to the job's end: a node started later
    than ``deadline - tail`` cannot meet the deadline (if the rest goes as planned)."""
    end = job_finish_ms(plan)
    if math.isnan(end):
        return {}
    return {n: max(0.0, end - p.start_ms) for n, p in plan.items()}


def latest_start(due_s: float, tail_ms: float, time_scale: float = 1.0) -> float:
    """The wall-clock time (epoch s) after which a node ``tail_ms`` from its job's end
    cannot meet a deadline at ``due_s``."""
    return due_s - tail_ms * time_scale / 1000.0


def should_shed(now_s: float, due_s: float | None, tail_ms: float,
                time_scale: float = 1.0) -> bool:
    """Whether a node starting at ``now_s`` can no longer meet its job's deadline."""
    return due_s is not None and now_s > latest_start(due_s, tail_ms, time_scale)


def retry_after_s(verdict: Verdict, time_scale: float = 1.0) -> float:
    """A rejection's retry-after in wall seconds."""
    return verdict.retry_after_ms * time_scale / 1000.0
