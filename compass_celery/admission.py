"""Admission at the edge: a task's or job's SLO read from the call, judged on its plan.

The judgement is the planner's (:func:`compass_celery.planner.admission.judge`, pure,
shared with the simulator); this module reads the settings, turns a refusal into
:class:`~compass_celery.errors.Rejected` before anything is written or sent, and
tells ``admission_decided`` listeners (metrics, the benchmark) either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .errors import CompassInputError, Rejected
from .needs import SLO_OPTIONS, TaskDeclarationError, declared
from .planner.admission import Slo, SloError, Verdict, judge, resolve_slo, retry_after_s
from .planner.priority import PriorityError, resolve_priority
from .signals import admission_decided
from .state.connection import StateUnavailable

#: The SLO class a refusal is counted under when the call named none (a bare deadline).
NO_CLASS = "none"
logger = logging.getLogger("compass_celery.admission")

if TYPE_CHECKING:
    from .context import CompassContext
    from .placement import Decision


class SloInputError(CompassInputError):
    """A call's ``slo=`` or ``deadline_ms=`` is not one compass knows."""


def slo_of(c: CompassContext, slo: str | None, deadline_ms: Any = None,
           on_miss: str | None = None) -> Slo | None:
    """The caller's SLO class and deadline as one :class:`Slo` (None: no deadline);
    a bad one raises :class:`SloInputError` naming it."""
    try:
        return resolve_slo(slo, deadline_ms, c.settings.slo_classes, on_miss)
    except SloError as exc:
        raise SloInputError(str(exc)) from None


def slo_of_call(c: CompassContext, call: Mapping[str, Any]) -> Slo | None:
    """:func:`slo_of` for a task call's ``compass={...}`` SLO options."""
    return slo_of(c, call.get("slo"), call.get("deadline_ms"), call.get("on_miss"))


def task_call(c: CompassContext, task: Any, options: dict[str, Any]) -> dict[str, Any]:
    """A plain task's ``apply_async`` options, with the keywords a Dag takes read as
    :meth:`Dag.apply_async <compass_celery.jobs.dag.Dag.apply_async>` reads them:
    ``slo=``, ``deadline_ms=`` and ``on_miss=`` join its ``compass={...}`` options (one
    given both ways, differently, is refused) and are checked by :func:`slo_of`;
    ``priority=`` is checked as a level 0..9 or a class name. A bad one raises naming it,
    before anything is sent; ``options`` is changed in place and returned."""
    keywords = {k: options.pop(k) for k in SLO_OPTIONS if k in options}
    call = options.get("compass")
    if keywords:
        call = dict(call or {})
        for key, value in keywords.items():
            if key in call and call[key] != value:
                raise SloInputError(f"task {task.name!r}: {key} given twice, {key}={value!r} "
                                    f"and compass={{{key!r}: {call[key]!r}}}: give it once")
            call[key] = value
        options["compass"] = call
    if isinstance(call, Mapping):
        slo_of_call(c, call)
    if (call or declared(task)) and "origin" not in options:  # a re-send: the broker's value
        try:
            resolve_priority(options.get("priority"), c.settings.priority_classes)
        except PriorityError as exc:
            raise TaskDeclarationError(f"task {task.name!r}: {exc}") from None
    return options


def admit(c: CompassContext, what: str, slo: Slo | None, predicted_ms: float,
          wait_ms: float, load_ms: float = 0.0,
          plan_errors: Mapping[str, float] | None = None, guessed: bool = False,
          missing: bool = False) -> Verdict:
    """Judge a plan, adding how late plans of its SLO class have run (learned from the
    jobs that ended: ``plan_errors``, SLO class -> ms, a snapshot's); ``guessed``: it
    rests on a run time nobody declared or measured; ``missing``: it loads a model no
    worker holds (``planner.admission.judge``). A refusal raises
    :class:`Rejected` (nothing was written or sent)."""
    cfg = c.settings
    error = (plan_errors or {}).get(slo.name, 0.0) if slo is not None else 0.0
    verdict = judge(slo, predicted_ms, wait_ms, max_queue_ms=cfg.max_queue_ms,
                    admission=cfg.admission, load_ms=load_ms,
                    headroom=cfg.admission_headroom, error_ms=error, guessed=guessed,
                    missing=missing)
    admission_decided.send(sender=c, what=what, slo=slo, verdict=verdict)
    if not verdict.admitted:
        count_refusal(c, slo, verdict)
        raise Rejected(what, verdict.reason,
                       retry_after_s=retry_after_s(verdict, cfg.time_scale),
                       predicted_ms=verdict.predicted_ms, deadline_ms=verdict.deadline_ms,
                       miss_ms=verdict.miss_ms, slo=slo.name if slo else "",
                       cause=verdict.cause)
    return verdict


def count_refusal(c: CompassContext, slo: Slo | None, verdict: Verdict) -> None:
    """Count a refusal in the state store by SLO class and cause (``compass status`` shows
    them, cluster-wide); best effort: a refusal never waits for, or fails on, Redis."""
    try:
        c.store.count_refusal(slo.name if slo is not None and slo.name else NO_CLASS,
                              verdict.cause or verdict.kind or "deadline")
    except (StateUnavailable, OSError) as exc:
        logger.debug("compass: refusal not counted: %s", exc)


def due_at(c: CompassContext, slo: Slo | None, now: float | None = None) -> float:
    """When an answer sent now is due (epoch s), or 0 without a deadline."""
    if slo is None or slo.deadline_ms is None:
        return 0.0
    now = time.time() if now is None else now
    return now + slo.deadline_ms * c.settings.time_scale / 1000.0


def expiry_time(raw: Any) -> datetime | None:
    """A message's ``expires`` header (ISO 8601, as Celery writes it) as an aware time;
    None when absent or unreadable (a naive one is taken as UTC, as Celery sends it)."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def shed_for_deadline(placed: Decision | None, now: float) -> bool:
    """Whether a task past its expiry was dropped for the deadline compass gave it (its
    placement's latest start, ``expires_at``, has passed), not for the caller's own
    ``expires=``: then it ends with :class:`~compass_celery.errors.DeadlineMissed`."""
    return placed is not None and bool(placed.expires_at) and now > placed.expires_at


def earliest_expiry(current: Any, expires_at: float) -> str:
    """A message's ``expires`` header (ISO 8601, as Celery writes it): the latest start
    that meets the deadline, or the caller's own ``expires=`` when that comes first."""
    ours = datetime.fromtimestamp(expires_at, tz=UTC)
    theirs = expiry_time(current)
    return current if theirs is not None and theirs < ours else ours.isoformat()
