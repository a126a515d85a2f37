"""Batched tasks on a worker: one forward pass over every input waiting for it.

A task declared with ``compass_batch={"max_size": 32, "max_wait_ms": 5}`` takes a list
of inputs and returns a list of results, one each; callers still send one input per
message and each gets its own result (or its own failure). When this worker starts
one, it claims up to ``max_size - 1`` more waiting messages of the same task and model
from its own queue, in one atomic step that puts them in flight as kombu's consumer
would (claim.lua, leased), runs the body once over all the inputs, then records each
member's result (a job node's completion, or the result backend) and acks each member
after its result is stored. A worker that dies mid-batch leaves the members in flight:
recovery re-places them once their leases lapse, as for any task it ran.

It waits for more inputs by the simulator's rule (``planner.batch.hold_until_ms``): only
while a batch is forming (some were waiting, fewer than ``max_size``) and nothing else
waits in its queue, until ``max_wait_ms`` after its first input was sent and never past
a member's latest start, the leader's own included; an idle worker with nothing else
waiting for the task starts at once. It blocks on the queue's lists meanwhile
(``wait_for_arrival``), woken by the first message pushed there.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from redis import RedisError

from ..admission import expiry_time, shed_for_deadline
from ..broker.kombu_redis import MessageError, parse_message
from ..errors import DeadlineMissed
from ..jobs.keys import JOB_HEADER
from ..jobs.retry import retry_transient
from ..placement import Decision
from ..planner.batch import BatchSpec, hold_until_ms
from ..state.connection import StateUnavailable
from .core import drop_at_dequeue
from .timescale import wall_s, workload_ms

if TYPE_CHECKING:
    from ..context import CompassContext
    from ..jobs.runtime import JobRuntime
    from ..settings import CompassSettings
    from .leases import Leases
    from .task_path import TaskPath

logger = logging.getLogger("compass_celery.worker")

_current: BatchRunner | None = None
_lock = threading.Lock()


def set_current_batcher(runner: BatchRunner | None) -> None:
    """Install (or with None, remove) this worker process's batch runner."""
    global _current
    with _lock:
        _current = runner


def current_batcher() -> BatchRunner | None:
    """This process's batch runner: None outside a compass worker (eager mode, a plain
    worker), where a batched task runs as a batch of one."""
    with _lock:
        return _current


@dataclass
class Member:
    """One claimed message of a batch: its id, delivery tag, input and headers."""

    id: str
    tag: str
    args: list[Any]
    headers: dict[str, Any]
    decision: Decision | None
    #: The request as the task path sees it (id, task, compass and job headers).
    request: Any = field(repr=False, default=None)

    @property
    def job(self) -> dict[str, Any] | None:
        """Its job header when it is a Dag node (None for a plain task)."""
        job = self.headers.get(JOB_HEADER)
        return job if isinstance(job, dict) else None


def member_of(raw: bytes, task: str) -> Member:
    """A claimed raw message as a batch member; raises MessageError when it is not one."""
    msg = parse_message(raw)
    headers, body = msg.get("headers") or {}, msg.get("body")
    if msg.get("content-type") != "application/json":
        raise MessageError(f"not JSON ({msg.get('content-type')}): compass uses JSON only")
    if (msg.get("properties") or {}).get("body_encoding") == "base64":
        try:
            body = json.loads(base64.b64decode(body))
        except (ValueError, TypeError) as exc:
            raise MessageError(f"undecodable body ({str(exc)[:80]})") from None
    if not isinstance(body, (list, tuple)) or len(body) < 2:
        raise MessageError("not a Celery protocol 2 body")
    args, kwargs = list(body[0] or []), dict(body[1] or {})
    tag = (msg.get("properties") or {}).get("delivery_tag")
    if not headers.get("id") or not isinstance(tag, str):
        raise MessageError("no task id or delivery tag")
    if len(args) != 1 or kwargs:
        raise MessageError("a batched task takes exactly one input per call")
    decision = Decision.from_header(headers.get("compass"))
    request = SimpleNamespace(id=headers["id"], task=task, compass=headers.get("compass"),
                              _request_dict=headers, **{JOB_HEADER: headers.get(JOB_HEADER)})
    return Member(headers["id"], tag, args, headers, decision, request)


def expired(headers: dict[str, Any], now: float) -> bool:
    """Whether a message's ``expires`` (Celery's header, ISO 8601) has passed: the worker
    core's drop-at-dequeue rule, the one the simulator runs."""
    when = expiry_time(headers.get("expires"))
    return drop_at_dequeue(now, when.timestamp() if when is not None else None)


class BatchRunner:
    """Claims a batch's members, runs the body once, settles each member."""

    def __init__(self, compass: CompassContext, queue: str, cfg: CompassSettings,
                 tasks: TaskPath, jobs: JobRuntime | None, leases: Leases) -> None:
        self.compass, self.queue, self.cfg = compass, queue, cfg
        self.tasks, self.jobs, self.leases = tasks, jobs, leases
        self.sizes: dict[int, int] = {}  # batch size -> batches run (for stats)

    # -- the leader's path ----------------------------------------------------------------
    def run(self, task: Any, opts: BatchSpec, value: Any) -> Any:
        """Run the leader's ``value`` with every waiting input of the same task and model
        as one call of ``task.run``; settle the others; return (or raise) the leader's."""
        decision = Decision.from_header(getattr(task.request, "compass", None))
        members = self._form(task, opts, decision)
        ready, inputs = [], [value]
        for m in members:
            if self._usable(task, m):
                ready.append(m)
                inputs.append(m.args[0])
        started = time.monotonic()
        for m in ready:
            self.tasks.batch_member_started(m.request, m.decision, started)
        outcomes = call_batched(task, inputs)
        self.sizes[len(inputs)] = self.sizes.get(len(inputs), 0) + 1
        self.tasks.batch_size([task.request.id, *(m.id for m in ready)], len(inputs))
        for m, outcome in zip(ready, outcomes[1:], strict=True):
            self._settle(task, m, outcome, len(inputs))
        ok, result = outcomes[0]
        if not ok:
            raise result
        return result

    def _form(self, task: Any, opts: BatchSpec, leader: Decision | None) -> list[Member]:
        """Claim what waits now; while :func:`~compass_celery.planner.batch.hold_until_ms`
        (the simulator's rule) says hold, block until more arrive, then claim again."""
        queues = self.compass.queues
        if not self.cfg.batching or queues is None:
            return []
        model = leader.model if leader else None
        members = self._claim(task, model, opts.max_size - 1)
        while True:
            others = bool(members) and self._others_waiting()  # alone, it starts anyway
            now = time.time()
            until = self._hold_until(opts, leader, members, now, others)
            if until <= now:
                return members
            try:
                queues.wait_for_arrival(self.queue, until - now)
            except (RedisError, OSError) as exc:  # cannot watch: start with what it has
                logger.warning("compass: batch of %d for %s starts without waiting for "
                               "more: %s", len(members) + 1, task.name, exc)
                return members
            members += self._claim(task, model, opts.max_size - 1 - len(members))

    def _hold_until(self, opts: BatchSpec, leader: Decision | None, members: list[Member],
                    now: float, others_ready: bool) -> float:
        """Until when (epoch s) the batch may hold open, by ``hold_until_ms``: not at all
        with ``others_ready`` (other work waits behind it), else until ``max_wait_ms``
        after its first input was sent (the oldest ``queued_at``, the sender's clock,
        never later than now) and never past a member's latest start (``expires_at``),
        the leader's own included; <= now: start."""
        decisions = [d for d in (leader, *(m.decision for m in members)) if d is not None]
        first = min([now, *(d.queued_at for d in decisions if d.queued_at > 0)])
        latest = [d.expires_at for d in decisions if d.expires_at > 0]
        scale = self.cfg.time_scale
        until_ms = hold_until_ms(
            workload_ms(first - now, scale), opts, waiting=len(members) + 1,
            others_ready=others_ready,
            latest_start_ms=workload_ms(min(latest) - now, scale) if latest else math.inf)
        return now + wall_s(until_ms, scale)

    def _others_waiting(self) -> bool:
        """Whether work other than the batch's waits in this worker's queue (every waiting
        member was just claimed, so whatever is left is not one); unknown counts as yes."""
        queues = self.compass.queues
        try:
            return queues is None or queues.waiting(self.queue) > 0
        except (RedisError, OSError):
            return True

    def _claim(self, task: Any, model: str | None, limit: int) -> list[Member]:
        queues = self.compass.queues
        if queues is None or limit <= 0:
            return []
        try:
            raws = queues.claim(self.queue, task.name, model, limit, time.time())
        except (RedisError, OSError) as exc:
            logger.warning("compass: batch of one for %s: %s", task.name, exc)
            return []
        members = []
        for raw in raws:
            try:
                members.append(member_of(raw, task.name))
            except MessageError as exc:  # claimed: keep it, with why, rather than lose it
                queues.dead_letter_raw(self.queue, raw, f"batch member: {exc}")
                with contextlib.suppress(MessageError):
                    queues.ack([parse_message(raw)["properties"]["delivery_tag"]])
                continue
            self.leases.hold(members[-1].id, members[-1].tag)
        return members

    def _usable(self, task: Any, m: Member) -> bool:
        """Whether a member runs: not revoked, not expired (both settled here as Celery
        would: marked revoked, its job failed when it expired), its job's inputs found."""
        from celery.worker import state as worker_state

        now = time.time()
        why = "revoked" if m.id in worker_state.revoked else \
            "expired" if expired(m.headers, now) else None
        if why is None and m.job is not None and self.jobs is not None:
            state = self.jobs.job_state(m.job.get("id", ""))
            why = "revoked" if state in ("FAILURE", "UNKNOWN") else None
        if why is None and m.job is not None and self.jobs is not None:
            try:
                self.jobs.resolve_inputs(m.job, m.args)
            except Exception as exc:  # its own failure, not the batch's
                self._settle(task, m, (False, exc), 1)
                return False
        if why is None:
            return True
        with contextlib.suppress(Exception):
            if why == "expired" and shed_for_deadline(m.decision, now):  # as CompassRequest
                task.backend.store_result(m.id, DeadlineMissed.of_task(
                    task.name, m.id, self.tasks.name), "REVOKED", request=m.request)
            else:
                task.backend.mark_as_revoked(m.id, why, request=m.request)
        self.tasks.task_revoked(m.request)
        if why == "expired":
            self.tasks.task_expired(m.request)
        self._ack(m)
        return False

    # -- each member's end ----------------------------------------------------------------
    def _settle(self, task: Any, m: Member, outcome: tuple[bool, Any], size: int) -> None:
        """Record a member's result as its own task's: the task path settles its charge,
        learns from it and completes its job node; a plain task's result goes to the
        result backend. Acked only after that."""
        ok, value = outcome
        state = "SUCCESS" if ok else "FAILURE"
        self.tasks.task_finished(task, m.request, m.decision, state, value)
        if m.job is None and not (m.headers.get("ignore_result") or task.ignore_result):
            self._store(task, m, value, ok)
        self._ack(m)

    def _store(self, task: Any, m: Member, value: Any, ok: bool) -> None:
        def store() -> None:
            if ok:
                task.backend.store_result(m.id, value, "SUCCESS", request=m.request)
            else:
                task.backend.mark_as_failure(m.id, value, request=m.request)

        try:
            retry_transient(f"storing the result of {m.id}", store,
                            give_up_s=self.cfg.submit_retry_s,
                            errors=(RedisError, OSError, StateUnavailable))
        except Exception as exc:
            logger.error("compass: result of batched task %s not stored: %s", m.id, exc)

    def _ack(self, m: Member) -> None:
        queues = self.compass.queues
        try:
            retry_transient(f"acking {m.id}", lambda: queues.ack([m.tag]),
                            give_up_s=self.cfg.submit_retry_s,
                            errors=(RedisError, OSError))
        except Exception as exc:  # left in flight: recovery re-places it (at least once)
            logger.error("compass: batched task %s not acked: %s", m.id, exc)
        self.leases.release(m.id)


def call_batched(task: Any, inputs: list[Any]) -> list[tuple[bool, Any]]:
    """``task.run(inputs)`` as (ok, result or exception) per input. The body returns one
    result per input, an exception instance failing that input alone; a body that raises
    is run again on each input alone, so one bad input fails no batch-mate."""
    try:
        results = task.run(list(inputs))
        _check(task, results, len(inputs))
    except Exception as exc:
        if len(inputs) == 1:
            return [(False, exc)]
        return [call_batched(task, [x])[0] for x in inputs]
    return [(not isinstance(r, BaseException), r) for r in results]


def _check(task: Any, results: Any, n: int) -> None:
    if not isinstance(results, (list, tuple)) or len(results) != n:
        got = f"{type(results).__name__} of {len(results)}" \
            if isinstance(results, (list, tuple)) else type(results).__name__
        raise TypeError(f"batched task {task.name!r} must return a list with one result per "
                        f"input ({n}), got {got}")
