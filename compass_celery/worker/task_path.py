"""One task's path through a worker: received, started, finished, revoked.

A task's receipt leases its message and drops a node whose job has already ended;
its start resolves the job's inputs and makes its model resident (prefetching what
is queued next); its end releases the model, settles the backlog, learns the run
time and completes the job node, retrying Redis hiccups until the completion lands,
before the message is acked.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis import RedisError

from .. import ledger
from .. import tracing as trace
from ..broker.fetch import fetched_job_state
from ..errors import JobError, RetriesExhausted
from ..jobs.keys import JOB_HEADER
from ..jobs.retry import permanent, retry_transient
from ..needs import batch_profile_key, profile_key, resolve_needs
from ..placement import Decision
from ..planner.batch import CurveLearner
from ..state.connection import StateUnavailable
from .timescale import wall_s, workload_ms

if TYPE_CHECKING:
    from ..cache import ModelCache
    from ..context import CompassContext
    from ..jobs.runtime import JobRuntime
    from ..settings import CompassSettings
    from .hop import DispatchHop
    from .leases import Leases
    from .overhead import HandlerCpu
    from .served import ServedDemand

logger = logging.getLogger("compass_celery.worker")

#: How far into a task its queue is peeked for models to prefetch (the peek is skipped
#: for tasks that are over by then: a load would hardly overlap them).
PREFETCH_AFTER_S = 0.005
#: How long a task's change to its charges may take before the reconcile stops waiting for
#: it (a message taken and never started, a write lost): the reconcile corrects what is left.
MOVING_MAX_S = 5.0

#: Backoff between tries of a job completion against Redis (doubling up to the cap).
COMPLETION_BACKOFF_S, COMPLETION_BACKOFF_CAP_S = 0.2, 2.0


class TaskPath:
    """What this worker does around each task it runs, and what it runs now."""

    def __init__(self, compass: CompassContext, name: str, cfg: CompassSettings,
                 cache: ModelCache, served: ServedDemand, jobs: JobRuntime | None,
                 leases: Leases, queued: Callable[[int], list[Decision]],
                 wake: threading.Event, stopping: threading.Event,
                 hop: DispatchHop, cpu: HandlerCpu) -> None:
        self.compass, self.name, self.cfg = compass, name, cfg
        self.cache, self.served, self.jobs, self.leases = cache, served, jobs, leases
        self.hop = hop  # the gaps between tasks, learned here, published by the record
        self._queued, self._wake, self._stopping = queued, wake, stopping
        self._prefetch_due = threading.Event()
        self._lock = threading.Lock()
        # task id -> (its decision, its model, whether the cache holds it for the task, when
        # it started running)
        self._running: dict[str, tuple[Decision | None, str | None, bool, float]] = {}
        self._timing: dict[str, dict[str, float]] = {}
        # task id -> (wall time it began running, when its charge says it ends, that
        # charge): what the record publishes as running (``WorkerView.running``)
        self._spans: dict[str, tuple[float, float, float]] = {}
        self._batch: dict[str, int] = {}  # task id -> the size of the batch it ran in
        self._curves: dict[str, CurveLearner] = {}  # batched task's profile -> its curve
        self.cpu = cpu  # what these handlers cost a task (a counter)
        # tasks whose charges this worker is changing in Redis (taken and not yet released
        # from its queued work; ended and their end not yet written), by when that began,
        # and a count of such changes: the reconcile writes only between them
        self._ledger_lock = threading.Lock()
        self._moving: dict[str, float] = {}
        self._epoch = 0

    # -- what runs now ------------------------------------------------------------------
    def running(self) -> int:
        """How many tasks run here now."""
        with self._lock:
            return len(self._running)

    def spans(self) -> tuple[tuple[float, float, float], ...]:
        """The tasks running here now, as the record publishes them: (when each began,
        when its charge says it ends, wall-clock s; its charge, ms), so a plan counts only
        what is left of each (``planner.cost.backlog_left_ms``)."""
        with self._lock:
            return tuple(sorted(self._spans.values()))

    def running_charge_ms(self) -> float:
        """The ms charged to this worker for the tasks running here now."""
        with self._lock:
            return sum(d.charge_ms for d, *_ in self._running.values()
                       if d is not None and d.worker == self.name)

    # -- Celery signal handlers, connected by the runtime while it runs -------------------
    def _ours(self, obj: Any) -> bool:
        return obj is not None and getattr(obj, "app", None) is self.compass.app

    def on_received(self, sender: Any = None, request: Any = None, **kw: Any) -> None:
        """``task_received``: lease the message, drop a node of an ended job."""
        if request is not None and self._ours(sender):
            with self.cpu.measure():
                self.task_received(request)

    def on_prerun(self, sender: Any = None, task: Any = None, args: Any = None,
                  **kw: Any) -> None:
        """``task_prerun``: inputs and model before the body runs."""
        task = task or sender
        if self._ours(task) and not task.request.is_eager:
            with self.cpu.measure():
                self.task_started(task, task.request, args)

    def on_postrun(self, sender: Any = None, task: Any = None, state: str | None = None,
                   retval: Any = None, **kw: Any) -> None:
        """``task_postrun``: settle the task before its message is acked; then drop a
        failed task's traceback (:func:`drop_traceback`)."""
        task = task or sender
        if self._ours(task) and not task.request.is_eager:
            try:
                with self.cpu.measure():
                    decision = Decision.from_header(getattr(task.request, "compass", None))
                    self.task_finished(task, task.request, decision, state, retval)
            finally:
                self.cpu.task_done()
                drop_traceback(retval)

    def on_revoked(self, sender: Any = None, request: Any = None, expired: bool = False,
                   **kw: Any) -> None:
        """``task_revoked``: take its charge off this worker's backlog; one that expired
        (past the latest start that met its deadline) is shed: its job fails at once."""
        if request is not None and (self._ours(sender) or sender is None):
            with self.cpu.measure():
                self.task_revoked(request)
                if expired:
                    self.task_expired(request)

    # -- the path -------------------------------------------------------------------------
    def task_received(self, request: Any) -> None:
        """Lease the message's tag; revoke a job node whose job already failed or expired."""
        self.moving(request.id)  # out of its list, still counted queued: until it starts
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if isinstance(tag, str) and tag:
            self.leases.hold(request.id, tag)  # leased from now until it is acked
        read_back_priority(request)
        job = (getattr(request, "request_dict", None) or {}).get(JOB_HEADER)
        if not isinstance(job, dict) or self.jobs is None:
            return
        # read by the fetch that took it, where the job records live in the broker's Redis
        state = fetched_job_state(tag) if isinstance(tag, str) else None
        if state is not None:
            state = state or "UNKNOWN"  # its record is gone
        else:
            try:
                state = self.jobs.job_state(job.get("id", ""), _sent(job))
            except (StateUnavailable, RedisError):
                return  # run it; a late completion is ignored if the job has ended
        if state in ("FAILURE", "UNKNOWN"):
            from celery.worker import state as worker_state

            logger.warning("compass: job %s is %s; not running its node %r", job.get("id"),
                           state.lower(), job.get("node"))
            worker_state.revoked.add(request.id)

    def task_started(self, task: Any, request: Any, args: Any = None) -> None:
        """Resolve a job node's inputs, load its model (prefetching queued ones), start timing."""
        decision = Decision.from_header(getattr(request, "compass", None))
        model = _task_model(task, decision)
        started, picked = time.monotonic(), time.time()  # picked: queue wait ends here
        with self._lock:
            alone = not self._running
        self.hop.started(picked, decision.queued_at if decision is not None else 0.0, alone)
        job = getattr(request, JOB_HEADER, None)
        trace.started(request.id, self.name, decision.priority if decision else None, job,
                      picked, getattr(task, "name", ""))
        # taken: it waits no longer, and the worker is busy from now on, its model's load
        # included (a load hid it: a plan saw the worker idle and put an urgent task behind
        # it, docs/results/mixed/real-sheds.txt); said in its inputs' round trip
        pipe = self._started_pipe(decision)
        if isinstance(job, dict) and self.jobs is not None:
            try:
                self.jobs.resolve_inputs(job, args, pipe)
            except JobError as exc:
                self.jobs.fail(job, request.id, exc, "inputs unavailable", task=task.name)
        self._run_started(pipe)  # unless the inputs' read ran it
        if model is not None:  # the worker's served rates are judged from its first start
            self.served.serving()
        charge = decision.charge_ms if decision is not None and \
            decision.worker == self.name else 0.0
        self._span(request.id, picked, charge)
        with self._lock:  # running (its charge counted) from here, its load included
            self._running[request.id] = (decision, model, False, time.monotonic())
        self.settled(request.id)
        # a model declared by size only is the task's own code's to load: not acquired here,
        # but its run is learned and served under its name all the same
        held = model is not None and self.cache.loadable(model)
        if held:
            if model in self.cache.resident():  # a hit: the queue peek only feeds the
                self.cache.acquire(model)        # prefetch, so it is made off this path
                self._prefetch_due.set()  # (by the prefetch loop)
            else:  # a load: what is queued next decides what it may evict
                queued = self._queued_models()
                with self.cpu.excluding():  # the model's cost, not the scheduler's
                    self.cache.acquire(model, queued)
                self.cache.prefetch(queued)
        loaded = time.monotonic()
        self._span(request.id, time.time(), charge)  # its run begins once its model is in
        with self._lock:
            self._running[request.id] = (decision, model, held, loaded)
            self._timing[request.id] = {"started": picked,
                                        "load_ms": self._ms(loaded - started)}

    def _span(self, task_id: str, began: float, charge: float) -> None:
        """Publish a task as running here from ``began`` (wall s) for its ``charge`` (ms):
        a plan counts only what is left of it. Nothing for a task charged elsewhere."""
        if not charge:
            return
        with self._lock:
            self._spans[task_id] = (began, began + wall_s(charge, self.cfg.time_scale), charge)
        self._wake.set()

    def batch_member_started(self, request: Any, decision: Decision | None,
                             started: float) -> None:
        """A claimed message starts as one input of a batch whose leader holds the model:
        it no longer waits, and its run is timed from the batch's start."""
        self._started_queued(decision)
        model = decision.model if decision is not None else None
        with self._lock:
            self._running[request.id] = (decision, model, False, started)
            self._timing[request.id] = {"started": time.time(), "load_ms": 0.0}

    def batch_size(self, task_ids: list[str], size: int) -> None:
        """``task_ids`` ran as one batch of ``size`` inputs: each one's learned run time
        and served work are its share of the one run, not the whole run again."""
        with self._lock:
            for tid in task_ids:
                self._batch[tid] = size

    def _started_queued(self, decision: Decision | None) -> None:
        """A task that starts no longer waits: take it off its level's queued work, which
        tasks of higher priority skip, and off its batch key's count of waiting inputs
        (best effort: reconciliation corrects both)."""
        self._run_started(self._started_pipe(decision))

    def _started_pipe(self, decision: Decision | None) -> Any:
        """:meth:`_started_queued`'s writes queued on a pipeline, not yet run (None:
        nothing to write, or written already where the store has no pipelines)."""
        if decision is None or decision.worker != self.name:
            return None
        if not ledger.waiting(decision):
            return None
        store = self.compass.store
        with contextlib.suppress(StateUnavailable, RedisError, OSError):
            pipe = store.client.pipeline(transaction=False) \
                if store.client is not None else None
            ledger.started(store, decision, pipe)
            return pipe
        return None

    def _run_started(self, pipe: Any) -> None:
        """Run :meth:`_started_pipe`'s pipeline, if something is still queued on it (one
        round trip, best effort)."""
        if pipe is None or not len(pipe):
            return
        with contextlib.suppress(StateUnavailable, RedisError, OSError):
            self.compass.store.execute(pipe)  # type: ignore[attr-defined]

    def task_finished(self, task: Any, request: Any, decision: Decision | None,
                      state: str | None, retval: Any = None) -> None:
        """Release the model, uncharge, learn the run time, record a job node's end."""
        self.hop.ended(time.time())
        trace.ended(request.id, time.time())
        self.moving(request.id)  # off the running set before its end is written: until then
        try:
            self._finish(task, request, decision, state, retval)
        finally:
            self.settled(request.id)

    def _finish(self, task: Any, request: Any, decision: Decision | None,
                state: str | None, retval: Any = None) -> None:
        """:meth:`task_finished`'s work, while its charges are marked as changing."""
        with self._lock:
            _, model, held, started = self._running.pop(request.id, (None, None, False, None))
            timing = self._timing.pop(request.id, {})
            self._spans.pop(request.id, None)
            size = self._batch.pop(request.id, 1)
        self.leases.release(request.id)
        if held:
            self.cache.release(model)
        run_ms = self._ms(time.monotonic() - started) if started is not None else 0.0
        share_ms = run_ms / size  # one input's share of a batch's run
        if model is not None and started is not None:
            self.served.ran(model, share_ms,  # published with the record (served.py)
                            urgent=bool(decision is not None and decision.due))
        store = self.compass.store
        pipe = store.client.pipeline(transaction=False) if store.client is not None else None
        unsettled = 0.0
        if decision is not None and decision.worker == self.name and decision.charge_ms:
            ledger.ended(store, decision, pipe)
            unsettled = decision.charge_ms if pipe is not None else 0.0
        if started is not None and state == "SUCCESS":  # learned in speed-1.0 ms (exec_ms)
            self._learn_run(task, model, size, run_ms * self.cfg.speed, pipe)
        job = getattr(request, JOB_HEADER, None)
        if isinstance(job, dict) and self.jobs is not None:
            # never skipped; a completed node's sends are confirmed on the same pipeline
            self._job_finished(job, request, state, retval, timing, run_ms, pipe, unsettled)
        # a job node's completion ran what was queued by then, in its own round trip
        try:  # bookkeeping is best effort (one round trip): reconciliation corrects it
            if pipe is not None and len(pipe):
                store.execute(pipe)  # type: ignore[attr-defined]
        except StateUnavailable as exc:
            logger.warning("compass: bookkeeping skipped, %s", exc)
        self._wake.set()

    def _learn_run(self, task: Any, model: str | None, size: int, run_ms: float,
                   pipe: Any) -> None:
        """Fold a measured run (``run_ms``, in speed-1.0 ms: what a plan divides by each
        worker's speed) into what the planner learns: a plain task's run time,
        or a batched task's curve (its single-input run under the usual field, what each
        input after the first adds under the batch field), fitted here from the passes
        this worker ran, each member reporting its pass with a share of the weight and
        the curve stored once a whole pass is in."""
        store, key = self.compass.store, profile_key(task.name, model)
        if getattr(task, "compass_batch", None) is None:
            store.record_run(key, run_ms / size, self.cfg.ewma_alpha, pipe=pipe)
            return
        with self._lock:
            learner = self._curves.setdefault(key, CurveLearner())
            learner.add(size, run_ms, 1.0 / size)
            curve = learner.take()
        if curve is not None:  # the fit is the smoothing: stored as it is
            store.record_run(key, curve.base_ms, 1.0, pipe=pipe)
            store.record_run(batch_profile_key(task.name, model), curve.per_item_ms, 1.0,
                             pipe=pipe)

    def task_revoked(self, request: Any) -> None:
        """Take a revoked task's charge off this worker's backlog."""
        decision = Decision.from_header(_header(request, "compass"))
        self.moving(request.id)
        try:
            if decision is not None and decision.worker == self.name and decision.charge_ms:
                with contextlib.suppress(StateUnavailable):
                    ledger.ended(self.compass.store, decision)
                with self._lock:
                    started = request.id in self._running
                if not started:  # it never ran: it no longer waits either
                    self._started_queued(decision)
        finally:
            self.settled(request.id)

    # -- the reconcile's turn: between this worker's own changes to its charges -----------
    def moving(self, task_id: str) -> None:
        """``task_id``'s charges are being changed in Redis (:meth:`settled` ends it)."""
        with self._ledger_lock:
            self._moving[task_id] = time.monotonic()
            self._epoch += 1

    def settled(self, task_id: str) -> None:
        """``task_id``'s change to its charges is written (or was never begun)."""
        with self._ledger_lock:
            if self._moving.pop(task_id, None) is not None:
                self._epoch += 1

    def ledger_epoch(self) -> int | None:
        """A mark of this worker's changes to its charges, None while one is under way (one
        older than :data:`MOVING_MAX_S` is given up: a message never started)."""
        with self._ledger_lock:
            now = time.monotonic()
            for task_id, since in list(self._moving.items()):
                if now - since > MOVING_MAX_S:
                    del self._moving[task_id]
            return None if self._moving else self._epoch

    def write_if_settled(self, epoch: int, write: Callable[[], Any]) -> bool:
        """Run ``write`` (the reconcile's absolute counts, worked out since ``epoch``) only
        if this worker changed none of its charges since, nor is changing one: else they
        would count a task's start or end twice, or not at all (the ended task is off the
        running set before its end's release reaches Redis: a reconcile in between set the
        backlog without it, and the release took it off again, docs/results/mixed/
        real-sheds.txt). False: not written, look again soon."""
        with self._ledger_lock:
            if self._moving or self._epoch != epoch:
                return False
            write()
            return True

    def task_expired(self, request: Any) -> None:
        """A task Celery dropped unrun because it expired: compass set its expiry to the
        latest start that could meet its deadline, so its job is failed now (not at its
        timeout), and the rest of its work revoked."""
        job = _header(request, JOB_HEADER)
        decision = Decision.from_header(_header(request, "compass"))
        trace.expired(request.id, self.name, decision.priority if decision else None, job)
        if isinstance(job, dict) and job.get("id") and self.jobs is not None:
            with contextlib.suppress(StateUnavailable, RedisError):  # it tells listeners
                self.jobs.shed(job, request.id, task=getattr(request, "task", None))
            return
        from ..signals import task_shed

        task_shed.send(sender=self.compass, job_id=None, node=None, task_id=request.id,
                       slo=decision.slo if decision else "")

    # -- job completion -------------------------------------------------------------------
    def _job_finished(self, job: dict, request: Any, state: str | None, retval: Any,
                      timing: dict[str, float], run_ms: float, pipe: Any = None,
                      unsettled_ms: float = 0.0) -> None:
        jobs = self.jobs
        assert jobs is not None
        if state == "SUCCESS":
            sent = float(job.get("sent") or timing.get("started", 0.0))
            timing = {**timing, "run_ms": run_ms, "finished": time.time(), "sent": sent,
                      "queued_ms": self._ms(max(0.0, timing.get("started", sent) - sent))}
            self._until_done(job, lambda: jobs.on_success(job, request.id, retval, timing,
                                                           pipe, unsettled_ms,
                                                           task=request.task))
        elif state == "FAILURE":
            exc = retval if isinstance(retval, BaseException) else RuntimeError(str(retval))
            self._until_done(job, lambda: jobs.fail(job, request.id, exc,
                                                    "task failed after its retries",
                                                    task=request.task))

    def _until_done(self, job: dict, step: Any) -> None:
        """Retry a job completion (or failure) until Redis takes it.

        Both are idempotent (complete.lua dedups, a duplicate resumes unconfirmed
        sends; fail.lua fails once). The message is acked only after this returns,
        so a worker dying meanwhile leaves it in flight for recovery: the job is
        never stranded. Past the job timeout there is nothing left to do: the
        recovery leader has failed the job at its deadline.
        """
        try:
            retry_transient(f"recording {job.get('id')}/{job.get('node')}", step,
                            give_up_s=self.cfg.job_timeout_s,
                            errors=(RedisError, OSError, StateUnavailable),
                            delay_s=COMPLETION_BACKOFF_S, max_delay_s=COMPLETION_BACKOFF_CAP_S)
        except RetriesExhausted as exc:
            logger.error("compass: %s; the job fails at its deadline", exc)
        except (RedisError, StateUnavailable) as exc:
            if not permanent(exc):
                raise
            # refused (a password, an ACL) or a wrong request: not retried, as no retry
            # could succeed
            logger.error("compass: recording %s/%s refused (%s); the job fails at its "
                         "deadline", job.get("id"), job.get("node"), exc)

    # -- prefetch -------------------------------------------------------------------------
    def _queued_models(self) -> list[str | None]:
        """The models of the next messages in this worker's queue (advisory: [] on error)."""
        try:
            return [d.model for d in self._queued(self.cfg.prefetch_depth)]
        except Exception:  # queue peek is advisory
            return []

    def prefetch_loop(self) -> None:
        """Keep the models of the next queued tasks loading behind the running one.

        A task's start asks for a peek (``PREFETCH_AFTER_S`` in, skipped for a task over
        by then). While a task runs, the queue is also peeked every ``prefetch_poll_s``,
        so a task routed here mid-run has its model loaded during its wait, as the
        planner and the simulator assume; a peek that finds the models of the last one
        asks the cache for nothing."""
        poll = float(self.cfg.prefetch_poll_s or 0.0)
        last: list[str | None] | None = None
        while not self._stopping.is_set():
            polling = poll > 0 and self.running() > 0
            due = self._prefetch_due.wait(poll if polling else 1.0)
            if due:
                self._prefetch_due.clear()
                # a task over by then leaves no run for a load to overlap: no peek for it
                if self._stopping.wait(PREFETCH_AFTER_S) or not self.running():
                    continue
            elif not polling or not self.running():
                last = None
                continue
            models = self._queued_models()
            if due or models != last:
                self.cache.prefetch(models)
            last = models

    def stop(self) -> None:
        """Wake the prefetch loop so it sees the stop (and skips its peek)."""
        self._prefetch_due.set()

    def _ms(self, seconds: float) -> float:
        """Real seconds as workload milliseconds."""
        return workload_ms(seconds, self.cfg.time_scale)


def drop_traceback(retval: Any) -> None:
    """Cut a failed task's exception from its traceback, once it is logged and recorded.

    Celery's tracer catches the task's exception in ``trace_task``, whose frame keeps it
    (``retval``), its ``TraceInfo`` (``I``) and its ``ExceptionInfo`` (``R``) as locals;
    ``exc.__traceback__`` points back at that frame, which Celery cannot clear while it
    runs. That cycle (with the request, frames and formatted traceback it reaches, some
    16 KB a failure) is freed only by a full garbage collection, which a worker's large,
    long-lived heap makes rare: RSS crept up with every failure. ``task_postrun`` is the
    last hook inside that frame; by then the failure is logged, stored and the job
    failed (only ``str(exc)`` is kept), so the reference is dropped here and the cycle
    is never made. The ``ExceptionInfo`` keeps its own copy of the traceback (text and
    a picklable one) for whatever still reports it."""
    if isinstance(retval, BaseException):
        retval.__traceback__ = None


def read_back_priority(request: Any) -> None:
    """The task reads back the level it was sent with in ``request.delivery_info``, on
    every broker: the broker's own value (a mirror image on kombu's Redis transport,
    ``planner.priority.broker_priority``) gives way to the level in its compass header.
    The dict is the one the request hands its pool, so the task's context sees it."""
    placed = _header(request, "compass")
    info = getattr(request, "delivery_info", None)
    if isinstance(placed, dict) and isinstance(info, dict) \
            and isinstance(placed.get("priority"), int):
        info["priority"] = placed["priority"]


def _header(request: Any, name: str) -> Any:
    """A message header as a revoked request carries it (its context, or the raw dict)."""
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "_request_dict", None) or {}).get(name)
    return value


def _sent(job: dict) -> float:
    """When a job node's message was sent (its header; 0 when it does not say)."""
    try:
        return float(job.get("sent") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _task_model(task: Any, decision: Decision | None) -> str | None:
    """The model a task runs with: its placement's, else its own declaration's."""
    if decision is not None and decision.model is not None:
        return decision.model
    needs = resolve_needs(task.name, task, None, {}, 0.0)
    return needs.model if needs else None
