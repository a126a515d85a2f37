"""Submitting a planned job: record it whole in Redis, send its sources, confirm them.

Only sources are sent at submission; the worker that finishes a node releases its
successors (:mod:`compass_celery.jobs.runtime`). Every step retries Redis hiccups
and checks whether a step whose reply was lost took effect, so a job is never
recorded or sent twice. :func:`publish_node` is also how workers send successors.

Each step stays in one Redis Cluster hash slot: the job's own keys are written in
one MULTI/EXEC (the job exists whole or not at all), then its deadline and its
planned-but-unsent work in another, on the cluster state's keys, once per job
(``once.lua`` under a guard key, so a retry never counts the work twice). Sources
are confirmed in the job's sent hash first, then charged once the same way. A
submitter that dies between two steps leaves a job nobody was handed, which expires
with its keys; its counters, backlog or pending, are never left charged for it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..broker.kombu_redis import message_headers
from ..placement import Decision
from ..planner.check import check_plan
from ..planner.demand import cluster_demand
from ..planner.pending import pending_work
from ..planner.types import SHARED, ClusterView, DagSpec, Placement
from ..state.cluster import is_cluster_client, run_pipeline
from ..state.mirror import CHANGE_LOG_SIZE, epoch_candidate
from ..state.scripts import register_script
from ..state.store import StateUnavailable
from .handle import JobHandle
from .keys import JOB_HEADER, JobKeys, deadlines_key, once_keys, placement_json
from .retry import retry_transient
from .validation import DagValidationError

if TYPE_CHECKING:
    from ..context import CompassContext


def submit(c: CompassContext, spec: DagSpec, nodes: dict[str, dict[str, Any]], *,
           timeout_s: float | None = None) -> JobHandle:
    """Plan a validated job and start it: record it whole, send its sources, confirm.

    ``nodes`` holds each node's task, arguments, model, estimates and edges as
    :meth:`~compass_celery.jobs.dag.Dag.records` gives them."""
    cfg = c.settings
    job_id = uuid.uuid4().hex
    keys = JobKeys.of(cfg["key_prefix"], job_id)
    try:
        snapshot = c.reader.get()
    except StateUnavailable:
        snapshot = None
    live = snapshot.workers if snapshot else ()
    if live:
        largest = max(w.gpu_total_mb for w in live)
        sizes = c.model_sizes()
        for n in spec.nodes.values():
            if n.model is not None and sizes.get(n.model, 0) > largest:
                raise DagValidationError(
                    f"DAG {spec.name!r}: node {n.name!r} needs model {n.model!r} "
                    f"({sizes[n.model]:.0f} MB), larger than every live worker's GPU "
                    f"(largest {largest:.0f} MB)")
        cluster = ClusterView.of(live, c.model_sizes(), snapshot.taken_at,
                                 demand=cluster_demand(live))
        full = c.policy.plan(spec, cluster)
        if cfg["validate"]:
            check_plan(full, spec, cluster)
        plan = full.placements
    else:
        plan = {}
    timeout = timeout_s if timeout_s is not None else cfg["job_timeout_s"]
    now = time.time()
    plan_json = {k: placement_json(p) for k, p in plan.items()}
    body = {"state": "RUNNING", "total": len(nodes), "ndone": 0, "name": spec.name,
            "nodes": json.dumps(nodes), "plan": json.dumps(plan_json),
            "sinks": json.dumps(spec.sinks()),  # what JobHandle.get returns, read in one go
            "created": now, "deadline": now + timeout, "policy": c.policy.name,
            # per node, for completions that must not read the whole DAG (complete.lua)
            **{f"n:{n}": json.dumps(v) for n, v in nodes.items()},
            **{f"p:{n}": json.dumps(v) for n, v in plan_json.items()}}
    client = c.store.client

    pending = pending_work(plan, {n: v["preds"] for n, v in nodes.items()})

    # On one Redis each pair of steps below is one transaction (one round trip); on a
    # Redis Cluster the job's keys and the cluster state's keys live in different hash
    # slots, so each step is a transaction of its own.
    single = not is_cluster_client(client)

    def record(pipe: Any) -> None:  # the job exists whole or not at all
        pipe.hset(keys.job, mapping=body)
        left = {n: len(v["preds"]) for n, v in nodes.items() if v["preds"]}
        if left:
            pipe.hset(keys.left, mapping=left)
        for key in keys.all():
            pipe.expire(key, int(cfg["job_ttl_s"]))

    def start(pipe: Any) -> None:  # its deadline, and planned work not sent yet counts (once)
        pipe.zadd(deadlines_key(cfg["key_prefix"]), {job_id: now + timeout})
        _add_once(c, pipe, f"{job_id}:plan", "p", list(pending.values()))

    # done or not, a retry of start is safe: ZADD is idempotent and once.lua adds the
    # work once; a job recorded is recorded whole, with its start when they share a step
    retry_transient(f"job {job_id}: recording it",
                    lambda: _transaction(client, record, *([start] if single else [])),
                    give_up_s=cfg["submit_retry_s"], done=lambda: bool(client.exists(keys.job)))
    if not single:
        retry_transient(f"job {job_id}: starting its clock", lambda: _transaction(client, start),
                        give_up_s=cfg["submit_retry_s"])
    handle = JobHandle(c, job_id)
    # sources: nobody else sends them, so they are recorded as sent after publishing
    sent = {}
    for name in spec.sources():
        task_id = f"{job_id}.{name}"
        sent[name] = retry_transient(
            f"job {job_id}: sending {name!r}",
            lambda n=name, t=task_id: publish_node(c, job_id, n, nodes[n], plan.get(n), None,
                                                   None, t),
            give_up_s=cfg["submit_retry_s"], done=lambda t=task_id: _queued(c, t))

    def confirm(pipe: Any) -> None:
        pipe.hset(keys.tasks, mapping={name: f"{job_id}.{name}" for name in sent})
        pipe.expire(keys.tasks, int(cfg["job_ttl_s"]))

    sources = [(d.worker, d.charge_ms) for d in sent.values()
               if isinstance(d, Decision) and d.charge_ms]

    def charge(pipe: Any) -> None:
        _add_once(c, pipe, f"{job_id}:sources", "b", sources)

    retry_transient(f"job {job_id}: confirming its sources",
                    lambda: _transaction(client, confirm, *([charge] if single else [])),
                    give_up_s=cfg["submit_retry_s"],
                    done=lambda: client.hlen(keys.tasks) >= len(sent))
    if not single:
        retry_transient(f"job {job_id}: charging its sources",
                        lambda: _transaction(client, charge), give_up_s=cfg["submit_retry_s"])
    # the next job this process plans sees this one at once, as the router's bursts do,
    # not only once its snapshot is read again
    for worker, ms in sources:
        c.reader.note_charge(worker, ms)
    for worker, ms in pending.values():
        c.reader.note_charge(worker, ms, pending=True)
    return handle


def _transaction(client: Any, *steps: Callable[[Any], None]) -> None:
    """Queue ``steps`` on one MULTI/EXEC pipeline and run it (one round trip)."""
    pipe = client.pipeline(transaction=True)
    for step in steps:
        step(pipe)
    run_pipeline(pipe)


def _add_once(c: CompassContext, client: Any, token: str, kind: str,
              changes: list[tuple[str, float]]) -> None:
    """Add each (worker, ms) to the backlog (``kind`` 'b') or pending ('p') counters once
    per ``token`` (once.lua), on ``client`` or a pipeline; nothing to add writes nothing."""
    if not changes:
        return
    prefix = c.settings["key_prefix"]
    guard, table, log, changes_key = once_keys(prefix, token, kind)
    ttl = int(c.settings["submit_retry_s"]) + 60  # outlasts every retry of this submission
    once = register_script(c.store.client, "changelog", "once")
    args: list[Any] = [ttl, kind, epoch_candidate(), CHANGE_LOG_SIZE]
    for worker, ms in changes:
        args += [worker, ms]
    once(keys=[guard, table, log, changes_key], args=args, client=client)


def publish_node(c: CompassContext, job_id: str, name: str, node: dict[str, Any],
                 placement: Placement | dict[str, Any] | None, inputs_ref: dict | None,
                 moved_from: str | None, task_id: str, planned: str | None = None
                 ) -> Decision:
    """Publish node ``name``'s task to its worker's queue (an explicit queue: the router
    stays out) under ``task_id``; the caller has claimed it and confirms it after."""
    p = placement_json(placement) if isinstance(placement, Placement) else placement
    if not p or p.get("worker") in (None, SHARED):
        queue, worker, charge = c.shared_queue, SHARED, 0.0
    else:
        queue, worker, charge = p["queue"], p["worker"], float(p.get("run_ms") or 0.0)
    decision = Decision(task=node["task"], model=node["model"], worker=worker, queue=queue,
                        policy=c.policy.name, charge_ms=charge,
                        est_finish_ms=float((p or {}).get("finish_ms", 0.0)),
                        load_ms=float((p or {}).get("load_ms", 0.0)), run_ms=node["exec_ms"],
                        reason=(p or {}).get("reason", "no live worker: shared queue"),
                        fallback=worker == SHARED)
    args = ([inputs_ref] if inputs_ref is not None else []) + node["args"]
    header = {"id": job_id, "node": name, "sent": time.time(), "moved_from": moved_from,
              "planned": planned if planned is not None else worker}
    # The job record keeps each node's output; Celery's result backend would be a
    # second write (and a read) per hop that nobody reads.
    c.app.send_task(node["task"], args=args, kwargs=node["kwargs"], queue=queue,
                    task_id=task_id, ignore_result=True,
                    headers={"compass": decision.as_header(), JOB_HEADER: header})
    c.remember(task_id, decision)
    return decision


def _queued(c: CompassContext, task_id: str) -> bool:
    """Whether a message with ``task_id`` already waits in a compass queue (a publish
    whose reply was lost); only checked after a failure."""
    queues = c.queues
    if queues is None:
        return False
    names = [c.shared_queue, *(c.queue_for(w.name) for w in c.reader.get().workers)]
    return any(message_headers(raw).get("id") == task_id
               for q in names for raw in queues.peek(q))
