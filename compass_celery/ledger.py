"""The ledger: what sending a task charges its worker's backlog, and what its start and
its end release.

A send charges three counts, all from the task's envelope (:class:`Decision`): its
worker's total backlog (``charge_ms``: its run and that worker's per-task hop,
``planner.pending.send_charge_ms``), the queued work of its priority level (the same ms,
which tasks of a higher level skip), and one more input waiting under its batch key. Its
start releases the level and the batch count (it no longer waits); its end releases the
total. The router, job submission, successor sends, recovery's re-placements, retries and
batches all charge through here, in Redis and in the sending process's own snapshot, so
what is charged is what is released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .planner.cost import MS_PER_S
from .planner.evict import eviction_rank
from .planner.fold import load_span
from .planner.types import SHARED
from .state.connection import StateUnavailable
from .state.keys import forming_member, queued_member
from .state.views import cluster_view

if TYPE_CHECKING:
    from .context import CompassContext
    from .placement import Decision
    from .state.store import Snapshot, StateStore

logger = logging.getLogger("compass_celery.router")

#: What a send charges, as (counter hash, member, amount): the hash by its name in
#: :data:`compass_celery.state.keys.COUNTERS` ("backlog", "queued", "forming"; a plan's
#: waiting nodes: "pending", "pending_queued").
Entries = list[tuple[str, str, float]]


def sent(decision: Decision) -> Entries:
    """The counters sending ``decision`` charges, and by how much: its worker's total
    (BACKLOG), its level's queued work (QUEUED) and its batch key's count (FORMING);
    empty when it charges nothing (the shared queue)."""
    if not decision.charge_ms:
        return []
    return [("backlog", decision.worker, decision.charge_ms), *waiting(decision)]


def waiting(decision: Decision) -> Entries:
    """What counts ``decision`` as waiting (its level's queued work, its batch key's
    inputs): charged by its send, released by its start."""
    if not decision.charge_ms:
        return []
    out = []
    if decision.priority is not None:
        out.append(("queued", queued_member(decision.worker, decision.priority),
                    decision.charge_ms))
    if decision.batch:
        out.append(("forming", forming_member(decision.worker, decision.batch), 1.0))
    return out


def planned(worker: str, ms: float, level: int | None) -> Entries:
    """What a job's node that waits for its inputs charges its planned worker until it is
    sent (:func:`compass_celery.planner.pending.pending_work`): its ms as planned work
    (PENDING), and at its priority level (PENDING_QUEUED), so a task of a higher level
    does not count it ahead of itself."""
    out = [("pending", worker, ms)]
    if level is not None:
        out.append(("pending_queued", queued_member(worker, level), ms))
    return out


def plan(c: CompassContext, worker: str, ms: float, level: int | None, sign: int = 1,
         pipe: Any = None) -> None:
    """Charge (``-1``: release, once the node is sent, shed or failed) what
    :func:`planned` says, in the store and in this process's snapshot."""
    post(c.store, planned(worker, ms, level), sign, pipe)
    note_plan(c, worker, ms, level, sign)


def note_plan(c: CompassContext, worker: str, ms: float, level: int | None,
              sign: int = 1) -> None:
    """Count planned work (``-1``: its release) in this process's snapshot at once, at its
    level too, as :func:`planned` charges it in the store."""
    c.reader.note_charge(worker, sign * ms, pending=True, level=level)


def post(store: StateStore, entries: Entries, sign: int = 1, pipe: Any = None) -> None:
    """Write ``entries`` (``-1``: take them back) to the store, on ``pipe`` if given: one
    write for them all."""
    store.count([(table, member, sign * amount, "add") for table, member, amount in entries],
                pipe)


def note(c: CompassContext, decision: Decision, sign: int = 1) -> None:
    """Count a send (``-1``: take it back) in this process's snapshot at once, so its
    next decision sees it before the next read."""
    if decision.charge_ms:
        c.reader.note_charge(decision.worker, sign * decision.charge_ms,
                             level=decision.priority, batch=decision.batch)


def note_load(c: CompassContext, worker: str, model: str | None, finish_ms: float,
              run_ms: float, snapshot: Snapshot,
              sizes: Mapping[str, float] | None = None) -> None:
    """Fold the load of ``model`` a placement on ``worker`` plans (its planned finish and
    run, ms) into this process's snapshot at once (``planner.fold.planned_load``): the
    model on its way there until it is planned to be in, and what the worker's cache
    would evict for it gone, so the next decision before the next read neither loads it
    a second time elsewhere nor counts the evicted models as there. Nothing when the
    model is resident or loading there already. ``snapshot``: the one the placement was
    planned on (its view ranks the victims, asked only when something must go);
    ``sizes``, the model sizes it was planned with (default: the context's now). A load
    this process's snapshot did not show yet is published for the other producers too
    (:func:`publish_load`)."""
    if model is None or worker == SHARED:
        return
    if sizes is None:
        sizes = c.model_sizes()
    span = load_span(time.time(), finish_ms, run_ms, MS_PER_S)
    if c.reader.note_load(worker, model, span, sizes,
                          lambda: eviction_rank(cluster_view(snapshot, sizes))):
        publish_load(c, worker, model, span[1])


def publish_load(c: CompassContext, worker: str, model: str, ends: float) -> None:
    """Publish a load of ``model`` this process planned on ``worker``, to end at ``ends``
    (unix s), so every producer's next read folds it in as this one did: with the
    router's charges when it has a batcher (no round trip of its own), else at once.
    Best effort: a store that is away loses it, and the worker's record shows the load
    once it starts."""
    charges = getattr(c.router, "charges", None)
    if charges is not None:
        charges.plan_load(worker, model, ends)
        return
    try:
        c.store.plan_loads([(worker, model, ends)])
    except StateUnavailable as exc:
        logger.debug("compass: planned load of %s on %s not published (%s)", model, worker,
                     exc)


def charge(c: CompassContext, decision: Decision, sign: int = 1, pipe: Any = None) -> None:
    """Charge a send (``-1``: take it back) in the store and in this process's snapshot."""
    post(c.store, sent(decision), sign, pipe)
    note(c, decision, sign)


def started(store: StateStore, decision: Decision, pipe: Any = None) -> None:
    """A task that starts no longer waits: release its level's and its batch's counts."""
    post(store, waiting(decision), -1, pipe)


def ended(store: StateStore, decision: Decision, pipe: Any = None) -> None:
    """A task that ended (or was revoked) no longer occupies its worker: release its total."""
    if decision.charge_ms:
        store.charge(decision.worker, -decision.charge_ms, pipe=pipe)
