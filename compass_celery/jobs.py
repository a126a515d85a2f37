"""Job runtime: submit a planned DAG, release successors exactly once, fail cleanly.

The job, its plan and its progress live in Redis under ``{prefix}:job:{id}``.
Only sources are sent at submission. When a node succeeds, its worker runs
``complete.lua`` (record the output, decrement each successor's count of
missing inputs, return those that reached zero), so a successor is sent
exactly once even when two predecessors finish together on different workers.
Before sending, the adjustment phase re-checks the successor's placement
against fresh state. A failure runs ``fail.lua`` once, revokes the siblings and
wakes the waiters. Keys expire after ``compass_job_ttl_s``.

Sending a node is claimed once (HSETNX in the job's sent hash) and a duplicate
completion resumes successors released but never sent, so a completion cut off
by a Redis timeout is finished by its retry or by a redelivery. One window stays:
a worker that dies between claiming a node and publishing it leaves that node
unsent; a waiter on the job then fails it at its deadline with a clear error, and
its records expire after the TTL: it is never waited on forever.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from kombu.exceptions import OperationalError

from . import keys as _keys
from .placement import Decision
from .planner.check import check_plan
from .planner.types import ClusterView, DagSpec, Placement
from .scripts import script
from .state import StateUnavailable, text

if TYPE_CHECKING:
    from .app import Compass
    from .dag import Dag

logger = logging.getLogger("compass_celery.jobs")

INPUT_REF = "__compass_inputs__"
JOB_HEADER = "compass_job"


class JobError(RuntimeError):
    """Base of job outcomes that are not a result."""


class JobFailed(JobError):
    """A node failed after its retries; names the node, task, worker and exception."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        super().__init__(f"job {info.get('job')} failed at node {info.get('node')!r} "
                         f"(task {info.get('task')}, worker {info.get('worker')}): "
                         f"{info.get('exc_type')}: {info.get('exc')}")


class JobTimeout(JobError, TimeoutError):
    """The job did not finish in time."""


@dataclass(frozen=True)
class JobKeys:
    job: str
    outputs: str
    left: str
    done: str
    info: str
    tasks: str

    @classmethod
    def of(cls, prefix: str, job_id: str) -> JobKeys:
        base = _keys.key(_keys.JOB, prefix, id=job_id)
        return cls(base, f"{base}:out", f"{base}:left", f"{base}:done", f"{base}:info",
                   f"{base}:tasks")

    def all(self) -> list[str]:
        """In the order complete.lua expects its KEYS."""
        return [self.job, self.outputs, self.left, self.done, self.info, self.tasks]


# -- submission ------------------------------------------------------------------------
def _node_json(dag: Dag, spec: DagSpec) -> dict[str, Any]:
    out = {}
    for name, node in dag.nodes.items():
        sig = node.signature
        out[name] = {"task": sig.task, "args": list(sig.args or ()), "kwargs": dict(sig.kwargs
                     or {}), "model": node.model, "exec_ms": node.exec_ms,
                     "output_kb": node.output_kb, "preds": list(node.preds),
                     "succs": spec.succs(name)}
    return out


def submit(dag: Dag, *, timeout_s: float | None = None) -> Any:
    """Plan ``dag`` and start it; eager apps run it inline (see :mod:`eager_jobs`)."""
    c = dag.app.compass
    spec = dag.spec()
    if c.eager:
        from .eager_jobs import run_eagerly

        return run_eagerly(dag, spec)
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
                from .dag_validation import DagValidationError

                raise DagValidationError(
                    f"DAG {spec.name!r}: node {n.name!r} needs model {n.model!r} "
                    f"({sizes[n.model]:.0f} MB), larger than every live worker's GPU "
                    f"(largest {largest:.0f} MB)")
        cluster = ClusterView.of(live, c.model_sizes(), snapshot.taken_at)
        full = c.policy.plan(spec, cluster)
        if cfg["validate"]:
            check_plan(full, spec, cluster)
        plan = full.placements
    else:
        plan = {}
    nodes = _node_json(dag, spec)
    timeout = timeout_s if timeout_s is not None else cfg["job_timeout_s"]
    now = time.time()
    plan_json = {k: _placement_json(p) for k, p in plan.items()}
    body = {"state": "RUNNING", "total": len(nodes), "ndone": 0, "name": spec.name,
            "nodes": json.dumps(nodes), "plan": json.dumps(plan_json),
            "created": now, "deadline": now + timeout, "policy": c.policy.name,
            # per node, for completions that must not read the whole DAG (complete.lua)
            **{f"n:{n}": json.dumps(v) for n, v in nodes.items()},
            **{f"p:{n}": json.dumps(v) for n, v in plan_json.items()}}
    client = c.store.client

    def record() -> None:
        pipe = client.pipeline()  # one MULTI/EXEC: the job exists whole or not at all
        pipe.hset(keys.job, mapping=body)
        left = {n: len(v["preds"]) for n, v in nodes.items() if v["preds"]}
        if left:
            pipe.hset(keys.left, mapping=left)
        for key in keys.all():
            pipe.expire(key, int(cfg["job_ttl_s"]))
        pipe.zadd(deadlines_key(cfg["key_prefix"]), {job_id: now + timeout})
        for name, node in nodes.items():  # planned work not sent yet counts on its worker
            if node["preds"] and name in plan and plan[name].worker != "*":
                c.store.add_pending(plan[name].worker, plan[name].run_ms, pipe=pipe)
        pipe.execute()

    retry_transient(f"job {job_id}: recording it", record, give_up_s=cfg["submit_retry_s"],
                    done=lambda: bool(client.exists(keys.job)))
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

    def confirm() -> None:
        pipe = client.pipeline()
        pipe.hset(keys.tasks, mapping={name: f"{job_id}.{name}" for name in sent})
        pipe.expire(keys.tasks, int(cfg["job_ttl_s"]))
        for decision in sent.values():
            if isinstance(decision, Decision) and decision.charge_ms:
                c.store.charge(decision.worker, decision.charge_ms, pipe=pipe)
        pipe.execute()

    retry_transient(f"job {job_id}: confirming its sources", confirm,
                    give_up_s=cfg["submit_retry_s"],
                    done=lambda: client.hlen(keys.tasks) >= len(sent))
    return handle


TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OSError, OperationalError,
             StateUnavailable)


class RetriesExhausted(JobError):
    """Redis stayed unavailable for longer than a step may wait for it."""


def retry_transient(what: str, step: Callable[[], Any], *, give_up_s: float,
                    done: Callable[[], bool] | None = None,
                    errors: tuple[type[BaseException], ...] = TRANSIENT,
                    delay_s: float = 0.1, max_delay_s: float = 1.0) -> Any:
    """Run ``step``, retrying Redis hiccups (a restart, a pause, a failover, AOF loading)
    with a doubling delay for up to ``give_up_s``, then raise :class:`RetriesExhausted`.

    ``done`` tells whether a step whose reply was lost took effect anyway, so
    nothing is written or published twice. Submissions and worker completions both
    retry through here.
    """
    give_up = time.monotonic() + give_up_s
    delay = delay_s
    while True:
        try:
            return step()
        except errors as exc:
            if done is not None:
                try:
                    if done():
                        return True
                except errors:
                    pass
            if time.monotonic() > give_up:
                raise RetriesExhausted(f"{what}: Redis unavailable for {give_up_s:g}s "
                                       f"({exc})") from exc
            logger.warning("compass: %s failed (%s); retrying in %.1fs", what, exc, delay)
            time.sleep(delay)
            delay = min(max_delay_s, delay * 2)


def _queued(c: Compass, task_id: str) -> bool:
    """Whether a message with ``task_id`` already waits in a compass queue (a publish
    whose reply was lost); only checked after a failure."""
    queues = c.queues
    if queues is None:
        return False
    from .transport import message_headers

    names = [c.shared_queue, *(c.queue_for(w.name) for w in c.reader.get().workers)]
    return any(message_headers(raw).get("id") == task_id
               for q in names for raw in queues.peek(q))


def _placement_json(p: Placement) -> dict[str, Any]:
    return {"worker": p.worker, "queue": p.queue, "start_ms": p.start_ms,
            "finish_ms": p.finish_ms, "load_ms": p.load_ms, "run_ms": p.run_ms,
            "reason": p.reason}


def publish_node(c: Compass, job_id: str, name: str, node: dict[str, Any],
                 placement: Placement | dict[str, Any] | None, inputs_ref: dict | None,
                 moved_from: str | None, task_id: str, planned: str | None = None
                 ) -> Decision:
    """Publish node ``name``'s task to its worker's queue (an explicit queue: the router
    stays out) under ``task_id``; the caller has claimed it and confirms it after."""
    p = _placement_json(placement) if isinstance(placement, Placement) else placement
    if not p or p.get("worker") in (None, "*"):
        queue, worker, charge = c.shared_queue, "*", 0.0
    else:
        queue, worker, charge = p["queue"], p["worker"], float(p.get("run_ms") or 0.0)
    decision = Decision(task=node["task"], model=node["model"], worker=worker, queue=queue,
                        policy=c.policy.name, charge_ms=charge,
                        est_finish_ms=float((p or {}).get("finish_ms", 0.0)),
                        load_ms=float((p or {}).get("load_ms", 0.0)), run_ms=node["exec_ms"],
                        reason=(p or {}).get("reason", "no live worker: shared queue"),
                        fallback=worker == "*")
    args = ([inputs_ref] if inputs_ref is not None else []) + node["args"]
    header = {"id": job_id, "node": name, "sent": time.time(), "moved_from": moved_from,
              "planned": planned if planned is not None else worker}
    c.app.send_task(node["task"], args=args, kwargs=node["kwargs"], queue=queue,
                    task_id=task_id, headers={"compass": decision.as_header(),
                                              JOB_HEADER: header})
    c.remember(task_id, decision)
    return decision


def fail_job(c: Compass, job_id: str, error: dict[str, Any]) -> str:
    keys = JobKeys.of(c.settings["key_prefix"], job_id)
    client = c.store.client
    fail = client.register_script(script("fail"))
    state = fail(keys=[keys.job, keys.done], args=[json.dumps(error),
                                                     int(c.settings["job_ttl_s"])])
    state = text(state)
    if state != "FAILURE":
        return state
    logger.warning("compass: job %s failed at %r: %s", job_id, error.get("node"),
                   error.get("exc"))
    plan_raw = client.hget(keys.job, "plan")
    done = {k.decode() for k in client.hkeys(keys.outputs)}
    sent = {k.decode(): v.decode().lstrip("?") for k, v in client.hgetall(keys.tasks).items()}
    left = {k.decode(): int(v) for k, v in client.hgetall(keys.left).items()}
    plan = json.loads(plan_raw or "{}")
    for node, count in left.items():  # planned successors that will never be sent
        p = plan.get(node)
        if count > 0 and p and p["worker"] != "*" and node not in done:
            c.store.add_pending(p["worker"], -p["run_ms"])
    revoke = [t for n, t in sent.items() if n not in done and t != error.get("task_id")]
    if revoke:
        c.app.control.revoke(revoke)
    return state


def deadlines_key(prefix: str) -> str:
    return _keys.key(_keys.JOB_DEADLINES, prefix)


def sweep_overdue(c: Compass, now: float, limit: int = 100) -> int:
    """Fail running jobs past their deadline, waited on or not, and forget ended ones:
    no job outlives its deadline unended, and its keys then expire with the TTL."""
    client = c.store.client
    key = deadlines_key(c.settings["key_prefix"])
    failed = 0
    for raw in client.zrangebyscore(key, "-inf", now, start=0, num=limit):
        job_id = text(raw)
        state = fail_job(c, job_id, {"job": job_id, "node": None, "task": None,
                                     "worker": None, "exc_type": "JobTimeout",
                                     "exc": "job deadline passed before it finished"})
        failed += state == "FAILURE"
        client.zrem(key, job_id)
    return failed


# -- the handle ------------------------------------------------------------------------
class JobHandle:
    """Like an AsyncResult for a whole job: ``get()``, ``status``, ``placement()``."""

    def __init__(self, compass: Compass, job_id: str) -> None:
        self.c, self.id = compass, job_id
        self.keys = JobKeys.of(compass.settings["key_prefix"], job_id)

    @property
    def client(self) -> Any:
        return self.c.store.client

    @property
    def status(self) -> str:
        state = self.client.hget(self.keys.job, "state")
        return state.decode() if state else "UNKNOWN"

    def ready(self) -> bool:
        return self.status in ("SUCCESS", "FAILURE")

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends (or ``timeout``); fail it when its deadline passes."""
        deadline_raw = self.client.hget(self.keys.job, "deadline")
        if deadline_raw is None:
            raise JobError(f"job {self.id} is unknown or expired")
        deadline = float(deadline_raw)
        until = deadline if timeout is None else min(deadline, time.time() + timeout)
        while True:
            state = self.status
            if state in ("SUCCESS", "FAILURE"):
                return state
            if state == "UNKNOWN":
                raise JobError(f"job {self.id}: its record is gone from Redis (expired after "
                               "compass_job_ttl_s, or Redis restarted without persistence)")
            left = until - time.time()
            if left <= 0:
                if time.time() >= deadline:
                    fail_job(self.c, self.id, {"job": self.id, "node": None, "task": None,
                                               "worker": None, "exc_type": "JobTimeout",
                                               "exc": "job deadline passed"})
                    continue
                raise JobTimeout(f"job {self.id} not finished within {timeout}s "
                                 f"(state {state})")
            # rotate the list onto itself: wakes on the end, leaves it (and its TTL) for
            # other waiters instead of recreating the key without one
            self.client.blmove(self.keys.done, self.keys.done, max(0.01, min(left, 1.0)),
                               "RIGHT", "LEFT")

    def get(self, timeout: float | None = None, propagate: bool = True) -> dict[str, Any]:
        """The sink results ``{node: result}``; raises JobFailed / JobTimeout."""
        state = self.wait(timeout)
        if state == "FAILURE":
            error = json.loads(self.client.hget(self.keys.job, "error") or "{}")
            if propagate:
                raise JobFailed(error)
            return {}
        nodes = json.loads(self.client.hget(self.keys.job, "nodes"))
        sinks = [n for n, v in nodes.items() if not v["succs"]]
        raw = self.client.hmget(self.keys.outputs, sinks)
        return {n: json.loads(r) if r is not None else None for n, r in zip(sinks, raw,
                                                                             strict=True)}

    @property
    def error(self) -> dict[str, Any] | None:
        raw = self.client.hget(self.keys.job, "error")
        return json.loads(raw) if raw else None

    def placement(self) -> dict[str, dict[str, Any]]:
        """Per node: planned worker, where it ran, whether it moved, its timings."""
        plan = json.loads(self.client.hget(self.keys.job, "plan") or "{}")
        info = {k.decode(): json.loads(v) for k, v in self.client.hgetall(self.keys.info).items()}
        nodes = json.loads(self.client.hget(self.keys.job, "nodes") or "{}")
        return {n: {"planned": (plan.get(n) or {}).get("worker"), **info.get(n, {}),
                    "moved": bool(info.get(n, {}).get("moved_from"))} for n in nodes}

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}>"
