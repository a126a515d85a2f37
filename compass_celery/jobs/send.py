"""Sending one job node to its worker's queue: the sources at submission, and the
successors a worker releases when their inputs are ready.

The node's message names its queue explicitly, so the router stays out; it carries
the placement (``compass`` header) and the job header (``compass_job``: job id, node,
when sent, where it moved from).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..broker.kombu_redis import message_headers
from ..placement import Decision
from ..planner.admission import latest_start
from ..planner.types import SHARED, Placement
from .keys import JOB_HEADER, inputs_repr, placement_json, planned_charge_ms
from .retry import NOT_DONE

if TYPE_CHECKING:
    from ..context import CompassContext


def state_max_age_s(has_deadline: bool, deadline_max_age_ms: float) -> float | None:
    """How old a snapshot a job's placement may plan on (``SnapshotReader.get``'s
    ``max_age_s``): ``compass_deadline_state_max_age_ms`` for a job with a deadline, the
    reader's own bounds (None) for others, which need not pay a read each.

    Traced on the real cluster at 160% load (docs/results/mixed/real-sheds.txt), admission
    planned on snapshots 40 ms old at the median, 68 ms at p90; in that time a worker the
    plan saw finishing had often started a batch task (it takes one the moment it is
    free), and one first step in six waited a batch run the plan did not count."""
    return deadline_max_age_ms / 1000.0 if has_deadline else None


def publish_node(c: CompassContext, job_id: str, name: str, node: dict[str, Any],
                 placement: Placement | dict[str, Any] | None, inputs_ref: dict | None,
                 moved_from: str | None, task_id: str, planned: str | None = None,
                 remember: bool = True) -> Decision:
    """Publish node ``name``'s task to its worker's queue (an explicit queue: the router
    stays out) under ``task_id``; the caller has claimed it and confirms it after. A
    worker sending successors passes ``remember=False``: ``placement()`` answers the
    process that submitted, and a worker would only fill its memory with them."""
    p = placement_json(placement) if isinstance(placement, Placement) else placement
    if not p or p.get("worker") in (None, SHARED):
        queue, worker, charge = c.shared_queue, SHARED, 0.0
    else:
        # joining a forming batch, it adds one input's share (charge_ms), not its run
        queue, worker = p["queue"], p["worker"]
        charge = float(p["charge_ms"]) if p.get("charge_ms") is not None \
            else planned_charge_ms(p)
    decision = Decision(task=node["task"], model=node["model"], worker=worker, queue=queue,
                        policy=c.policy.name, charge_ms=charge,
                        est_finish_ms=float((p or {}).get("finish_ms", 0.0)),
                        load_ms=float((p or {}).get("load_ms", 0.0)), run_ms=node["exec_ms"],
                        exec_ms=node["exec_ms"],
                        reason=(p or {}).get("reason", "no live worker: shared queue"),
                        fallback=worker == SHARED, priority=node.get("priority"),
                        queued_at=time.time(), slo=node.get("slo") or "",
                        due=float(node.get("due") or 0.0), expires_at=_expires_at(c, node),
                        batch=(node.get("batch") or {}).get("key") or ""
                        if worker != SHARED else "")
    args = ([inputs_ref] if inputs_ref is not None else []) + node["args"]
    header = {"id": job_id, "node": name, "sent": time.time(), "moved_from": moved_from,
              "planned": planned if planned is not None else worker}
    if node.get("preds") and node.get("due"):  # a later step of a job with a deadline:
        header["later"] = True  # it waits ahead of its level's first steps
    if node.get("due"):  # whoever ends the job says whether it met its deadline, and
        # how late against its plan
        header.update(slo=node.get("slo") or "", due=node["due"],
                      plan_end=node.get("plan_end") or 0.0, tail_ms=node.get("tail_ms"),
                      deadline_ms=node.get("deadline_ms"))
    # The job record keeps each node's output; Celery's result backend would be a
    # second write (and a read) per hop that nobody reads.
    c.app.send_task(node["task"], args=args, kwargs=node["kwargs"],
                    queue=c.destination(queue),
                    task_id=task_id, ignore_result=True,
                    headers={"compass": decision.as_header(), JOB_HEADER: header},
                    **_reprs(args, node["kwargs"]))
    if remember:
        c.remember(task_id, decision)
    return decision


def _reprs(args: list[Any], kwargs: Any) -> dict[str, str]:
    """The ``argsrepr``/``kwargsrepr`` a node's message carries, where known without
    Celery's saferepr (~45 us for an input reference, ~9 us for no kwargs, per hop): the
    input reference's as Flower shows it (the annotation put it there anyway), and
    ``{}``. Celery also copies them into the message's properties, which the publish
    hook takes out again (``Compass._before_publish``)."""
    out = {}
    shown = inputs_repr(args)
    if shown is not None:
        out["argsrepr"] = shown
    if not kwargs:
        out["kwargsrepr"] = "{}"
    return out


def _expires_at(c: CompassContext, node: dict[str, Any]) -> float:
    """When starting ``node`` can no longer meet its job's deadline (0: never), from its
    planned time to the job's end."""
    if not node.get("due") or node.get("tail_ms") is None:
        return 0.0
    return latest_start(float(node["due"]), float(node["tail_ms"]), c.settings.time_scale)


def published(c: CompassContext, task_id: str, remember: bool = True) -> Any:
    """The :class:`Decision` a publish whose reply was lost sent ``task_id`` with, read
    back from its waiting message (remembered, as :func:`publish_node` would have), or
    ``NOT_DONE`` when none waits: a ``done`` check for sending a node, so the caller
    charges what was sent rather than skipping it. Only checked after a failure."""
    headers = _queued_headers(c, task_id)
    if headers is None:
        return NOT_DONE
    decision = Decision.from_header(headers.get("compass"))
    if decision is not None and remember:
        c.remember(task_id, decision)
    return decision


def _queued_headers(c: CompassContext, task_id: str) -> dict[str, Any] | None:
    """The headers of the message with ``task_id`` waiting in a compass queue, if any."""
    queues = c.queues
    if queues is None:
        return None
    names = [c.shared_queue, *(c.queue_for(w.name) for w in c.reader.get().workers)]
    for q in names:
        for raw in queues.peek(q):
            headers = message_headers(raw)
            if headers.get("id") == task_id:
                return headers
    return None
