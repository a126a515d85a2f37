"""The Celery router: a placement becomes the chosen worker's own queue.

It only translates (celery's routes.py habit): resolve what the task needs, ask
:func:`compass_celery.placement.decide`, charge the backlog, return
``{'queue': ...}``. Tasks without compass options get ``None`` so the user's
own routes apply. State trouble routes to the shared queue, warns once, and
never raises: an enqueue must not fail because Redis blinked.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from . import ledger
from . import refused as refusals
from .admission import admit, due_at, slo_of_call
from .errors import Rejected
from .needs import call_slo, resolve_needs, wants_learned
from .placement import Decision, decide, fallback
from .planner.admission import Slo, latest_start, load_wanted, plan_budget_ms
from .planner.cost import evolve
from .planner.demand import cluster_demand
from .planner.priority import resolve_priority, user_priority
from .signals import task_placed
from .state.charges import ChargeBatcher
from .state.connection import StateUnavailable
from .state.store import Snapshot

if TYPE_CHECKING:
    from .context import CompassContext

logger = logging.getLogger("compass_celery.router")


def announce(c: CompassContext, decision: Decision) -> None:
    """Tell ``task_placed`` listeners (metrics, Flower, tests) where a task went."""
    task_placed.send(sender=c, decision=decision)


class CompassRouter:
    """Callable router for ``task_routes``; per process, fork-safe through its store."""

    def __init__(self, compass: CompassContext) -> None:
        self.compass = compass
        self._local = threading.local()
        self._warned: set[str] = set()
        self.fallbacks = 0
        self.charges: ChargeBatcher | None = None

    def __call__(self, name: str, args: Any, kwargs: Any, options: dict[str, Any],
                 task: Any = None, **kw: Any) -> dict[str, Any] | None:
        c = self.compass
        carried = self._resent(options)
        if options.get("queue") is not None:
            return None  # an explicit queue (job runtime, the caller) wins; nothing to charge
        task = task if task is not None else c.app.tasks.get(name)
        c.follow_mode(eager=False)  # routers run only when tasks are sent, not run eagerly
        default_ms = c.settings.default_exec_ms
        needs = resolve_needs(name, task, options, {}, default_ms)
        if needs is None:
            return None  # not ours: nothing read, nothing started
        slo = slo_of_call(c, call_slo(options))
        level = carried.priority if carried is not None else self._level(options, slo)
        try:
            snapshot = c.reader.get()
        except StateUnavailable as exc:
            snapshot = None
            why = f"state unavailable ({exc})"
        if snapshot is not None and wants_learned(needs):  # a learned run time or curve?
            needs = resolve_needs(name, task, options, snapshot.profiles, default_ms)
        if snapshot is None:
            decision = self._fallback(needs, why)
        else:
            sizes = c.model_sizes()  # once: the plan and the fold of its load alike
            decision = decide(needs, snapshot, c.policy, sizes, c.shared_queue,
                              c.settings.validate, priority=level,
                              batch_aware=c.settings.batch_aware,
                              budget_ms=self._budget(slo, snapshot), refused=refusals.refused(c),
                              hold_max_ms=c.settings.hold_max_ms)
            if decision.fallback:
                decision = self._fallback(needs, decision.reason)
            else:
                # a refusal raises: nothing charged
                decision = self._admit(decision, slo, snapshot,
                                       guessed=needs.exec_source == "default")
                try:
                    self._charge(decision)
                    ledger.note_load(c, decision.worker, decision.model,
                                     decision.est_finish_ms, decision.run_ms, snapshot,
                                     sizes)
                except StateUnavailable as exc:
                    decision = self._fallback(needs, f"state unavailable ({exc})")
        if not decision.fallback:
            self._warned.clear()  # healthy again: warn afresh on the next outage
        # the level rides in the compass header; the publish hook maps it for the broker
        decision = carried.replaced(decision) if carried is not None \
            else evolve(decision, priority=level, queued_at=time.time())
        self._local.pending = decision
        announce(c, decision)
        return {"queue": c.destination(decision.queue)}

    def _charge(self, decision: Decision) -> None:
        """Charge the chosen worker (the ledger): at once in this process's snapshot; in
        Redis through the batcher, off the enqueue path (in-process stores directly)."""
        c = self.compass
        if not decision.charge_ms:
            return
        if c.store.client is None:
            ledger.charge(c, decision)
            return
        if self.charges is None:
            self.charges = ChargeBatcher(c.store, c.settings.charge_linger_s)
            # this process's charges are in Redis before the reader reads there, and
            # those made while it reads are folded into what it read
            c.reader.charges = self.charges
        ledger.note(c, decision)
        for table, member, amount in ledger.sent(decision):
            self.charges.add(member, amount, table)

    def _admit(self, decision: Decision, slo: Slo | None, snapshot: Snapshot,
               guessed: bool = False) -> Decision:
        """Judge the placement against the task's deadline and the queue bound; refused,
        :class:`~compass_celery.errors.Rejected` is raised before anything is written.
        Admitted with a deadline that sheds, the decision carries the latest start that
        can still meet it (the message's ``expires``)."""
        c = self.compass
        # whether the load adds a copy the model lacks: judge reads it only for a task
        # with a deadline, and it costs a pass summing every worker's demand
        missing = bool(slo is not None and slo.deadline_ms is not None and decision.load_ms
                       and decision.model is not None and load_wanted(
                           decision.model, snapshot.workers,
                           refusals.with_refused(c, cluster_demand(snapshot.workers))))
        try:
            verdict = admit(c, f"task {decision.task!r}", slo, decision.est_finish_ms,
                            decision.wait_ms, decision.load_ms, snapshot.plan_errors,
                            guessed, missing)
        except Rejected:  # demand all the same: a model refused often wants copies
            refusals.note(c, [(decision.model, decision.exec_ms or decision.run_ms)],
                          urgent=slo is not None and slo.deadline_ms is not None)
            raise
        if slo is None:
            return decision
        due = due_at(c, slo)
        expires = 0.0
        if due and slo.sheds and verdict.sheds:
            tail = max(0.0, decision.est_finish_ms - decision.wait_ms)
            expires = latest_start(due, tail, c.settings.time_scale)
        return evolve(decision, slo=slo.name, due=due, expires_at=expires,
                      late=verdict.late)

    def _budget(self, slo: Slo | None, snapshot: Snapshot) -> float | None:
        """The time a task with ``slo`` should be planned to end within (its deadline
        less admission's reserve); None without a deadline."""
        if slo is None:
            return None
        return plan_budget_ms(slo, self.compass.settings.admission_headroom,
                              snapshot.plan_errors.get(slo.name, 0.0))

    def _level(self, options: dict[str, Any], slo: Slo | None = None) -> int:
        """The task's priority level: the caller's ``priority=`` (a level or a class), else
        its SLO class's; for a re-send built from a request (a retry), the broker's value
        mapped back."""
        c, raw = self.compass, options.get("priority")
        if "origin" in options and isinstance(raw, int) and not isinstance(raw, bool):
            return user_priority(raw, redis=not c.amqp_broker)
        if raw is None and slo is not None:
            raw = slo.priority
        return resolve_priority(raw, c.settings.priority_classes)

    def _resent(self, options: dict[str, Any]) -> Decision | None:
        """For a re-send built from a request (``Task.retry``: signature_from_request
        carries 'origin', the old headers and the old worker's queue), unpin it so it is
        re-placed rather than sent back to a worker that may be busy or gone, and return
        the placement it carried, whose task fields (level, age, deadline) it keeps."""
        if "origin" not in options:
            return None
        if self._pinned_to_worker(options):
            for key in ("queue", "exchange", "routing_key"):
                options.pop(key, None)
        headers = options.get("headers")
        return Decision.from_header(headers.get("compass")) \
            if isinstance(headers, dict) else None

    def _pinned_to_worker(self, options: dict[str, Any]) -> bool:
        queue = options.get("queue")
        name = getattr(queue, "name", queue) or options.get("routing_key") or ""
        return isinstance(name, str) and name.startswith(self.compass.settings.queue_prefix)

    def _fallback(self, needs: Any, why: str) -> Decision:
        self.fallbacks += 1
        if why.split(" (")[0] not in self._warned:
            self._warned.add(why.split(" (")[0])
            logger.warning("compass: routing to shared queue %r: %s",
                           self.compass.shared_queue, why)
        return fallback(needs, self.compass.shared_queue, self.compass.policy.name, why)

    def take_pending(self, name: str) -> Decision | None:
        """The decision made for ``name`` on this thread, consumed by before_task_publish."""
        decision = getattr(self._local, "pending", None)
        if decision is not None and decision.task == name:
            self._local.pending = None
            return decision
        return None
