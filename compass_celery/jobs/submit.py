"""Submitting a planned job: record it whole in Redis, send its sources, confirm them.

Only sources are sent at submission; the worker that finishes a node releases its
successors (:mod:`compass_celery.jobs.runtime`). Every step retries Redis hiccups
and checks whether a step whose reply was lost took effect, so a job is never
recorded or sent twice. Sending one node is :mod:`compass_celery.jobs.send`, which
workers use for successors too.

Each step stays in one Redis Cluster hash slot: the job's own keys are written in
one MULTI/EXEC (the job exists whole or not at all), then its deadline and its
planned-but-unsent work in another, on the cluster state's keys, once per job
(``once.lua`` under a guard key, so a retry never counts the work twice). Sources
are confirmed in the job's sent hash first, then charged once the same way. A
submitter that dies between two steps leaves a job nobody was handed, which expires
with its keys; its counters, backlog or pending, are never left charged for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis import RedisError

from .. import ledger
from .. import refused as refusals
from .. import tracing as trace
from ..admission import NO_CLASS, admit, due_at
from ..dag_validation import DagValidationError
from ..errors import Rejected, RetriesExhausted, SendFailed
from ..needs import batch_profile_key, profile_key, with_learned_curve
from ..placement import Decision
from ..planner.admission import (
    Slo,
    job_finish_ms,
    job_load_ms,
    job_missing,
    job_wait_ms,
    plan_budget_ms,
    tails_ms,
)
from ..planner.batch import batch_record
from ..planner.check import check_plan
from ..planner.compass import plan_job
from ..planner.pending import pending_work
from ..planner.priority import race_clock
from ..planner.types import DagSpec, Placement
from ..state import arrivals
from ..state.cluster import is_cluster_client
from ..state.connection import StateUnavailable
from ..state.keys import COUNTERS
from ..state.mirror import CHANGE_LOG_SIZE, epoch_candidate
from ..state.scripts import register_script, run_pipeline
from ..state.store import Snapshot
from ..state.views import planning_view
from .handle import JobHandle
from .keys import JobKeys, deadlines_key, once_keys, placement_json
from .limits import check_submission
from .retry import done_if, retry_transient
from .send import publish_node, published, state_max_age_s

if TYPE_CHECKING:
    from ..context import CompassContext


@dataclass(frozen=True)
class _Submission:
    """One job on its way in: its id and keys, its nodes, and how its steps are grouped."""

    c: CompassContext
    job_id: str
    keys: JobKeys
    nodes: dict[str, dict[str, Any]]
    #: On one Redis each pair of steps is one transaction (one round trip); on a Redis
    #: Cluster the job's keys and the cluster state's keys live in different hash slots,
    #: so each step is a transaction of its own.
    single: bool
    retry_s: float

    def step(self, what: str, *steps: Callable[[Any], None],
             done: Callable[[], bool] | None = None) -> None:
        """Run ``steps`` as one transaction, retried through Redis hiccups; with ``single``
        off, the first step alone and then each of the others. ``done`` says whether the
        first took effect although its reply was lost (a transaction returns nothing)."""
        client = self.c.store.client
        groups = [steps] if self.single else [steps[:1], *((s,) for s in steps[1:])]
        for i, group in enumerate(groups):
            retry_transient(f"job {self.job_id}: {what}",
                            lambda g=group: _transaction(client, *g), give_up_s=self.retry_s,
                            done=done_if(done) if done is not None and i == 0 else None)


def submit(c: CompassContext, spec: DagSpec, nodes: dict[str, dict[str, Any]], *,
           timeout_s: float | None = None, slo: Slo | None = None) -> JobHandle:
    """Plan a validated job, admit it, and start it: record it whole, send its sources,
    confirm.

    ``nodes`` holds each node's task, arguments, model, estimates and edges as
    :meth:`~compass_celery.jobs.dag.Dag.records` gives them. A job refused by admission
    (``slo``'s deadline, the queue bound) raises before anything is written or sent."""
    cfg = c.settings
    check_submission(cfg, spec.name, nodes)  # before anything is written or sent
    job_id = uuid.uuid4().hex
    job = _Submission(c, job_id, JobKeys.of(cfg.key_prefix, job_id), nodes,
                      not is_cluster_client(c.store.client), cfg.submit_retry_s)
    spec, guessed = _learned(c, spec, nodes)
    plan, snapshot, missing = _plan(
        c, spec, max((v.get("priority") or 0 for v in nodes.values()), default=0), slo)
    try:
        verdict = admit(c, f"job {spec.name!r}", slo, job_finish_ms(plan),
                        job_wait_ms(plan), job_load_ms(plan),
                        snapshot.plan_errors if snapshot else None, guessed, missing)
    except Rejected:  # demand all the same: a model refused often wants copies
        refusals.note(c, [(t.model, t.exec_ms) for t in spec.nodes.values()],
                      urgent=slo is not None and slo.deadline_ms is not None)
        _count_refused_arrival(c, slo)
        raise
    _stamp_deadline(c, nodes, plan, slo, verdict.sheds)
    if trace.enabled():
        trace.event("plan", job=job_id, snap_taken=snapshot.taken_at if snapshot else None,
                    sources={n: p.worker for n, p in plan.items() if not nodes[n]["preds"]})
    timeout = timeout_s if timeout_s is not None else cfg.job_timeout_s
    pending = pending_work(plan, {n: v["preds"] for n, v in nodes.items()})
    try:
        _record(job, spec, plan, pending, timeout, verdict.late, _arrival_class(slo))
    except RetriesExhausted as exc:  # nothing sent: the caller may send it again
        raise not_sent(c, spec.name, f"could not be reached for {job.retry_s:g} s: "
                                     f"{exc.__cause__ or exc}") from exc
    handle = JobHandle(c, job_id)
    sources = _send_sources(job, spec, plan)
    # the next job this process plans sees this one at once, as the router's bursts do,
    # not only once its snapshot is read again
    for decision in sources:
        ledger.note(c, decision)
    for node, (worker, ms) in pending.items():
        ledger.note_plan(c, worker, ms, nodes[node].get("priority"))
    if snapshot is not None:  # and the loads it plans, until the next read
        for node, p in plan.items():
            ledger.note_load(c, p.worker, spec.nodes[node].model, p.finish_ms, p.run_ms,
                             snapshot)
    return handle


def not_sent(c: CompassContext, name: str, why: str) -> SendFailed:
    """The :class:`SendFailed` a plain task's send raises too, for job ``name`` of which
    nothing was sent (Redis refused it, or never answered before the give-up time),
    saying ``why`` and naming the URLs (passwords masked)."""
    from ..state.urls import masked

    state_url = c.app.compass.redis_url  # type: ignore[attr-defined]
    return SendFailed(
        f"job {name!r} was not sent (nothing was queued): the state Redis at "
        f"{masked(state_url or '')} or the broker at "
        f"{masked(c.app.conf.broker_url or '')} {why}")


def _stamp_deadline(c: CompassContext, nodes: dict[str, dict[str, Any]],
                    plan: dict[str, Placement], slo: Slo | None, sheds: bool = True) -> None:
    """Give each node its job's SLO class and due time and, when the job sheds, its
    planned time to the job's end: what its worker needs to drop it unrun once it can no
    longer meet the deadline, and to say whether the job met it."""
    due = due_at(c, slo)
    if not due or slo is None:
        return
    tails = tails_ms(plan) if slo.sheds and sheds else {}
    end = job_finish_ms(plan)  # when the plan says it ends, to learn how late plans run
    plan_end = 0.0 if math.isnan(end) else time.time() + end * c.settings.time_scale / 1000
    for name, node in nodes.items():
        node["slo"], node["due"], node["plan_end"] = slo.name, due, plan_end
        node["deadline_ms"] = slo.deadline_ms  # the learned plan error's step
        if name in tails:
            node["tail_ms"] = tails[name]


def _learned(c: CompassContext, spec: DagSpec, nodes: dict[str, dict[str, Any]]
             ) -> tuple[DagSpec, bool]:
    """Nodes whose run time nobody declared take the one learned from measured runs of
    the same task and model (as a plain task's routing does); their records say so too,
    for successor re-placement. Without state, or nothing learned, the spec is as given.
    Also says whether a node is left on the default run time (guessed, for admission)."""
    learn = [name for name, node in nodes.items() if node.get("learn")]
    try:
        profiles = c.reader.get().profiles
    except StateUnavailable:
        return spec, bool(learn)
    changed, learned = {}, 0
    for name, node in nodes.items():
        task = spec.nodes[name]
        if name in learn and (ms := profiles.get(profile_key(node["task"], node["model"]))
                              ) is not None:
            node["exec_ms"], learned = float(ms), learned + 1
            task = dataclasses.replace(task, exec_ms=float(ms))
        if task.batch is not None:  # a curve its workers learned, where none is declared
            batch = with_learned_curve(task.batch, task.exec_ms, profiles.get(
                batch_profile_key(node["task"], node["model"])))
            node["batch"] = batch_record(batch)
            task = dataclasses.replace(task, batch=batch)
        if task != spec.nodes[name]:
            changed[name] = task
    return (dataclasses.replace(spec, nodes={**spec.nodes, **changed}) if changed else spec,
            learned < len(learn))


def _plan(c: CompassContext, spec: DagSpec, level: int = 0, slo: Slo | None = None
          ) -> tuple[dict[str, Placement], Snapshot | None, bool]:
    """The whole job's placement on the live workers (none known: every node goes to
    the shared queue), waiting only for work at priority ``level`` or above and what is
    in flight, against ``slo``'s deadline budget (``planner.compass.plan_job``); the
    snapshot it was made on, and whether it loads a model no worker holds; a model
    larger than every live GPU is refused here."""
    try:  # a job with a deadline on state read now (send.state_max_age_s)
        snapshot = c.reader.get(max_age_s=state_max_age_s(
            slo is not None and slo.deadline_ms is not None,
            c.settings.deadline_state_max_age_ms))
    except StateUnavailable:
        return {}, None, False
    live = snapshot.workers
    if not live:
        return {}, snapshot, False
    largest = max(w.gpu_total_mb for w in live)
    sizes = c.model_sizes()
    for n in spec.nodes.values():
        if n.model is not None and sizes.get(n.model, 0) > largest:
            raise DagValidationError(
                f"DAG {spec.name!r}: node {n.name!r} needs model {n.model!r} "
                f"({sizes[n.model]:.0f} MB), larger than every live worker's GPU "
                f"(largest {largest:.0f} MB)")
    race = race_clock(snapshot.taken_at, c.settings.hold_max_ms)
    # the view the router plans on, carried over from its last decision at this level
    cluster = planning_view(snapshot, sizes, level, race, refusals.refused(c))
    budget = plan_budget_ms(slo, c.settings.admission_headroom,
                            snapshot.plan_errors.get(slo.name, 0.0)) if slo else None
    full = plan_job(c.policy, spec, cluster, budget)
    if c.settings.validate:
        check_plan(full, spec, cluster)
    models = {n: t.model for n, t in spec.nodes.items()}
    return dict(full.placements), snapshot, job_missing(full.placements, models, cluster)


def _arrival_class(slo: Slo | None) -> str:
    """The class an arrival is counted under (the autoscaler's classes: no SLO, "none")."""
    return slo.name if slo is not None and slo.name else NO_CLASS


def _count_refused_arrival(c: CompassContext, slo: Slo | None) -> None:
    """Count a refused job's arrival (the rate a fleet must serve includes what it
    refused); best effort, as the refusal's own count: never waits for, or fails on,
    Redis."""
    if not c.settings.count_arrivals or c.store.client is None:
        return
    with contextlib.suppress(StateUnavailable, OSError, RedisError):
        arrivals.count_refused_arrival(c.store.client, c.settings.key_prefix,
                                       _arrival_class(slo))


def _record(job: _Submission, spec: DagSpec, plan: dict[str, Placement],
            pending: dict[str, tuple[str, float]], timeout: float, late: bool = False,
            arrival: str | None = None) -> None:
    """Record the job whole, then start its clock, count its planned work (once) and its
    arrival under class ``arrival`` (with ``count_arrivals``)."""
    c, nodes, ttl = job.c, job.nodes, int(job.c.settings.job_ttl_s)
    now = time.time()
    # each entry with its node's level: what releasing its planned work takes back
    plan_json = {k: {**placement_json(p), **_level_of(nodes[k])} for k, p in plan.items()}
    body = {"state": "RUNNING", "total": len(nodes), "ndone": 0, "name": spec.name,
            "names": json.dumps(list(nodes)), "plan": json.dumps(plan_json),
            "sinks": json.dumps(spec.sinks()),  # what JobHandle.get returns, read in one go
            "created": now, "deadline": now + timeout, "policy": c.policy.name,
            **_slo_fields(nodes, late),
            # per node, for completions that must not read the whole DAG (complete.lua);
            # each node once, and a source without its input (see _stored)
            **{f"n:{n}": json.dumps(_stored(v)) for n, v in nodes.items()},
            **{f"p:{n}": json.dumps(v) for n, v in plan_json.items()}}

    def record(pipe: Any) -> None:  # the job exists whole or not at all
        pipe.hset(job.keys.job, mapping=body)
        left = {n: len(v["preds"]) for n, v in nodes.items() if v["preds"]}
        if left:
            pipe.hset(job.keys.left, mapping=left)
        for key in job.keys.all():
            pipe.expire(key, ttl)

    def start(pipe: Any) -> None:  # its deadline, and planned work not sent yet counts (once)
        pipe.zadd(deadlines_key(c.settings.key_prefix), {job.job_id: now + timeout})
        if arrival is not None and c.settings.count_arrivals:  # same slot as the deadline
            arrivals.count_arrival(pipe, c.settings.key_prefix, arrival, now)
        _add_once(c, pipe, f"{job.job_id}:plan",
                  [x for n, (worker, ms) in pending.items()
                   for x in ledger.planned(worker, ms, nodes[n].get("priority"))])

    # done or not, a retry of start is safe: ZADD is idempotent and once.lua adds the
    # work once; a job recorded is recorded whole, with its start when they share a step
    job.step("recording it", record, start,
             done=lambda: bool(c.store.client.exists(job.keys.job)))


def _slo_fields(nodes: dict[str, dict[str, Any]], late: bool) -> dict[str, Any]:
    """The job record's SLO fields: its class, when it is due, whether admission took it
    knowing it would be late (none without a deadline)."""
    first = next(iter(nodes.values()), {})
    if not first.get("due"):
        return {}
    return {"slo": first.get("slo", ""), "due": first["due"], "late": int(late)}


def _stored(node: dict[str, Any]) -> dict[str, Any]:
    """A node as the job record keeps it: a source's arguments (the job's input) travel
    in its message alone, sent from memory here and re-placed as a message by recovery,
    so no copy of them stays in Redis for the job's TTL; a later node's own arguments
    are kept, for the worker that sends it."""
    if node["preds"]:
        return node
    return {k: v for k, v in node.items() if k not in ("args", "kwargs")}


def _level_of(node: dict[str, Any]) -> dict[str, int]:
    """A node's priority level as its stored plan entry carries it (none: no level)."""
    level = node.get("priority")
    return {} if level is None else {"level": level}


def _send_sources(job: _Submission, spec: DagSpec, plan: dict[str, Placement]
                  ) -> list[Decision]:
    """Send the job's sources (nobody else does), then record them as sent and charge
    their workers once (the ledger); -> the decisions charged."""
    c, job_id = job.c, job.job_id
    sent = {}
    for name in _in_planned_order(spec.sources(), plan):
        task_id = f"{job_id}.{name}"
        sent[name] = retry_transient(
            f"job {job_id}: sending {name!r}",
            lambda n=name, t=task_id: publish_node(c, job_id, n, job.nodes[n], plan.get(n),
                                                   None, None, t),
            # a publish whose reply was lost gives the Decision it sent: charged below too
            give_up_s=job.retry_s, done=lambda t=task_id: published(c, t))
    charged = [d for d in sent.values() if isinstance(d, Decision) and d.charge_ms]

    def confirm(pipe: Any) -> None:
        pipe.hset(job.keys.tasks, mapping={name: f"{job_id}.{name}" for name in sent})
        pipe.expire(job.keys.tasks, int(c.settings.job_ttl_s))

    def charge(pipe: Any) -> None:
        _add_once(c, pipe, f"{job_id}:sources", [x for d in charged for x in ledger.sent(d)])

    job.step("confirming its sources", confirm, charge,
             done=lambda: c.store.client.hlen(job.keys.tasks) >= len(sent))
    return charged


def _in_planned_order(sources: list[str], plan: dict[str, Placement]) -> list[str]:
    """Sources in the order the plan starts them: two on one worker's queue run in the
    order they are sent, and the plan's waits (and its successors' starts) assumed its
    own order, the longest path first."""
    far = float("inf")
    return sorted(sources, key=lambda n: (plan[n].start_ms if n in plan else far,
                                          sources.index(n)))


def _transaction(client: Any, *steps: Callable[[Any], None]) -> None:
    """Queue ``steps`` on one MULTI/EXEC pipeline and run it (one round trip)."""
    pipe = client.pipeline(transaction=True)
    for step in steps:
        step(pipe)
    run_pipeline(pipe)


def _add_once(c: CompassContext, client: Any, token: str,
              changes: list[tuple[str, str, float]]) -> None:
    """Add each (counter hash, member, amount), as the ledger gives them, once per
    ``token`` (once.lua), on ``client`` or a pipeline; nothing to add writes nothing."""
    if not changes:
        return
    ttl = int(c.settings.submit_retry_s) + 60  # outlasts every retry of this submission
    once = register_script(c.store.client, "changelog", "once")
    args: list[Any] = [ttl, epoch_candidate(), CHANGE_LOG_SIZE]
    for table, member, amount in changes:
        args += [COUNTERS[table][1], member, amount]
    once(keys=once_keys(c.settings.key_prefix, token), args=args, client=client)
