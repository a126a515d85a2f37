"""Worker side of the job runtime: inputs in, outputs out, successors on.

Runs in the worker that executed a node: it resolves the node's inputs (local
output cache first, then Redis), records the output through ``complete.lua``,
re-checks each released successor's placement against fresh state (the
adjustment phase) and sends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from redis import RedisError

from .. import ledger
from .. import tracing as trace
from ..broker.fetch import held_pushes
from ..errors import JobError, JobTimeout
from ..needs import learned_loads
from ..placement import Decision
from ..planner.adjust import choose_successor
from ..planner.admission import ERROR_QUANTILE, error_step_ms, should_shed
from ..planner.batch import batch_from_record
from ..planner.cost import settled
from ..planner.demand import cluster_demand
from ..planner.priority import for_priority, race_clock
from ..planner.types import SHARED, ClusterView, TaskSpec
from ..state.connection import StateUnavailable, text
from ..state.scripts import register_script
from .failure import fail_job, forget_deadline
from .keys import INPUT_REF, JobKeys, planned_charge_ms
from .limits import output_too_large
from .send import publish_node

if TYPE_CHECKING:
    from ..context import CompassContext

logger = logging.getLogger("compass_celery.jobs")

#: How long a job this worker saw running (its own completion of one of the job's nodes
#: released successors) counts as running at a successor's receipt, without asking Redis
#: again; so does a job whose node was sent this recently (its sender saw it running: a
#: producer that made it, a worker whose completion released the node). A failure here
#: forgets it at once; one on another worker within this window may let one more node
#: run here, whose completion is then refused as late.
SEEN_RUNNING_S = 1.0


class OutputCache:
    """Recent node outputs on a worker, for collocated successors (LRU, capped in bytes
    of their JSON, so a few large outputs cannot take the worker's memory). An output
    is only worth keeping while its successors may still start here: a job's outputs go
    when it ends on this worker, and any output once it is ``max_age_s`` old (a successor
    that starts later reads it from Redis), so the cache empties when the load stops
    instead of filling to its cap."""

    def __init__(self, capacity_bytes: int = 256 * 2**20, max_age_s: float = 60.0) -> None:
        self.capacity_bytes, self.max_age_s = capacity_bytes, max_age_s
        # (job, node) -> (value, size, when kept), oldest first
        self._items: OrderedDict[tuple[str, str], tuple[Any, int, float]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def put(self, job: str, node: str, value: Any, size: int) -> None:
        """Keep a node's output for local successors, evicting the oldest; too large is not kept."""
        now = time.monotonic()
        self._expire(now)
        if size > self.capacity_bytes:
            return  # would evict everything else; its successors read Redis
        self._pop((job, node))
        self._items[(job, node)] = (value, size, now)
        self.bytes += size
        while self.bytes > self.capacity_bytes:
            self._pop(next(iter(self._items)))

    def get(self, job: str, node: str) -> tuple[bool, Any]:
        """``(True, value)`` if the output is held here, else ``(False, None)``; counts hits."""
        key = (job, node)
        if key in self._items:
            self.hits += 1
            return True, self._items[key][0]
        self.misses += 1
        return False, None

    def drop_job(self, job: str) -> None:
        """Forget every output of a job that has ended."""
        for key in [k for k in self._items if k[0] == job]:
            self._pop(key)

    def _expire(self, now: float) -> None:
        while self._items:
            key, (_, _, kept) = next(iter(self._items.items()))
            if now - kept <= self.max_age_s:
                return
            self._pop(key)

    def _pop(self, key: tuple[str, str]) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]


# -- completion (runs on the worker that finished a node) ------------------------------
class JobRuntime:
    """Worker-side job bookkeeping: inputs in, outputs out, successors on."""

    def __init__(self, compass: CompassContext, worker_name: str) -> None:
        self.c, self.name = compass, worker_name
        self.outputs = OutputCache(int(compass.settings.output_cache_mb * 2**20))
        # job id -> when this worker saw it running (monotonic); None: it failed here
        self._seen_running: OrderedDict[str, float | None] = OrderedDict()
        client = compass.store.client
        self._complete = register_script(client, "complete")

    def keys(self, job_id: str) -> JobKeys:
        """The Redis keys of job ``job_id`` under this app's key prefix."""
        return JobKeys.of(self.c.settings.key_prefix, job_id)

    def job_state(self, job_id: str, sent: float = 0.0) -> str:
        """Job ``job_id``'s state: ``RUNNING`` if this worker completed one of its nodes
        within ``SEEN_RUNNING_S`` (a collocated successor's receipt asks Redis nothing),
        or if the node received was ``sent`` (its sender's wall clock, epoch s) within it
        (a node sent moments ago by another worker or a producer asks nothing either: its
        round trip sat between a busy worker's tasks), unless the job failed here; else
        Redis's, or ``UNKNOWN`` once its record is gone."""
        if job_id in self._seen_running:
            seen = self._seen_running[job_id]
            if seen is None:  # failed here: always asked
                sent = 0.0
            elif time.monotonic() - seen < SEEN_RUNNING_S:
                return "RUNNING"
        if sent and 0.0 <= time.time() - sent < SEEN_RUNNING_S:
            return "RUNNING"
        state = self.c.store.client.hget(self.keys(job_id).job, "state")
        return state.decode() if state else "UNKNOWN"

    def _saw_running(self, job_id: str, failed: bool = False) -> None:
        self._seen_running[job_id] = None if failed else time.monotonic()
        self._seen_running.move_to_end(job_id)
        while len(self._seen_running) > 4096:
            self._seen_running.popitem(last=False)

    def _failed_here(self, job_id: str) -> None:
        """This worker failed the job: its nodes received here ask Redis again, however
        recently they were sent."""
        self._saw_running(job_id, failed=True)

    def resolve_inputs(self, job: dict[str, Any], args: Any, pipe: Any = None) -> None:
        """Replace the input reference (first arg) in place with the predecessors' outputs.
        Outputs this worker does not hold are read on ``pipe`` when given, with what the
        caller queued there (its start's bookkeeping): one round trip for both."""
        if not isinstance(args, list) or not args or not isinstance(args[0], dict) \
                or INPUT_REF not in args[0]:
            return
        ref = args[0][INPUT_REF]
        preds, job_id = ref["preds"], job["id"]
        values: dict[str, Any] = {}
        missing = []
        for p in preds:
            hit, value = self.outputs.get(job_id, p)
            if hit:
                values[p] = value
            else:
                missing.append(p)
        if missing:
            key = self.keys(job_id).outputs
            if pipe is not None:
                pipe.hmget(key, missing)
                raw = self.c.store.execute(pipe)[-1]  # type: ignore[attr-defined]
            else:
                raw = self.c.store.client.hmget(key, missing)
            for p, r in zip(missing, raw, strict=True):
                if r is None:
                    raise JobError(f"job {job_id}: output of {p!r} is gone (expired?)")
                values[p] = json.loads(r)
        args[0] = values[preds[0]] if ref.get("single") else [values[p] for p in preds]

    def on_success(self, job: dict[str, Any], task_id: str, retval: Any,
                   timing: dict[str, float], pipe: Any = None, unsettled_ms: float = 0.0,
                   task: str | None = None) -> list[str]:
        """Record the node's output and send the successors it released.

        ``pipe`` holds the worker's own bookkeeping for this task: it runs with the
        completion (:meth:`_run_complete`), and the confirmation of the sends rides on
        it afterwards, so a node's end costs no round trip of its own. What is queued
        on it later and left unsent (nothing released, or the completion was refused),
        the caller sends. ``unsettled_ms`` is this task's charge, on this worker's
        backlog in Redis until that pipeline runs; re-placement takes it off a snapshot
        read before. ``task`` (the task's name) is named, with ``task_id``, by a failure
        recorded here."""
        job_id, node = job["id"], job["node"]
        keys = self.keys(job_id)
        cfg = self.c.settings
        try:
            output = json.dumps(retval)
        except (TypeError, ValueError) as exc:
            self.fail(job, task_id, exc, "output is not JSON-serialisable", task=task)
            return []
        # its size is known from here on: over the limit, nothing of it is written
        too_large = output_too_large(cfg, task, task_id, output)
        if too_large is not None:
            self.fail(job, task_id, too_large, "output too large", task=task)
            return []
        info = {"worker": self.name, "task_id": task_id, "moved_from": job.get("moved_from"),
                "planned": job.get("planned"), **timing}
        result, settled_at = self._run_complete(
            keys.all(), [node, output, int(cfg.job_ttl_s), json.dumps(info), time.time(),
                         job_id], pipe)
        status = text(result[0])
        released = [tuple(text(x) for x in result[i:i + 5]) for i in range(1, len(result), 5)]
        if status == "expired":
            self.fail(job, task_id, JobTimeout("job deadline passed"), "timed out", task=task)
            return []
        if status == "finished":  # nothing left to time out (see forget_deadline)
            forget_deadline(self.c, job_id, pipe)
            self.outputs.drop_job(job_id)
            self._deadline_outcome(job, float(timing.get("finished") or time.time()))
        if status in ("missing", "late") or (status == "duplicate" and not released):
            logger.warning("compass: completion of %s/%s ignored (%s)", job_id, node,
                           status if status != "missing" else "job unknown or expired")
            return []
        if status == "duplicate":
            logger.warning("compass: completion of %s/%s is a duplicate; sending %s, released "
                           "but never confirmed sent", job_id, node, [r[0] for r in released])
        elif status != "finished":  # an ended job's outputs have no successor left to feed
            self.outputs.put(job_id, node, retval, len(output))
            if released:  # still running: its successors were just released
                self._saw_running(job_id)
        # each released successor's record, decoded once (shedding and sending read it)
        specs = [json.loads(r[2]) for r in released]
        late = self._too_late(released, specs) if status != "duplicate" else None
        if late is not None:  # shed before spending: none of them would meet the deadline
            succ, tail_ms, succ_task = late
            trace.event("shed", job=job_id, node=succ, by=self.name, tail_ms=tail_ms)
            self.shed(job, task_id, task=succ_task, node=succ, released=released,
                      tail_ms=tail_ms)
            return []
        return self._send_released(job_id, keys, released, resumed=status == "duplicate",
                                   pipe=pipe, unsettled=(unsettled_ms, settled_at),
                                   specs=specs)

    def _run_complete(self, keys: list[str], args: list[Any], pipe: Any
                      ) -> tuple[Any, float | None]:
        """complete.lua's reply, and when the caller's bookkeeping queued on ``pipe`` (its
        charge off the backlog, its run time learned) was written with it (wall s; None:
        nothing was queued there, it runs later). Both go in one round trip: the end
        costs the worker one round trip fewer between a task and the next. A try that
        raised leaves ``pipe`` empty (run or not: bookkeeping is best effort, and the
        reconcile corrects it), so a retried completion never writes it twice."""
        if pipe is None or not len(pipe):
            return self._complete(keys=keys, args=args), None
        written = time.time()
        try:
            self._complete(keys=keys, args=args, client=pipe)
            return self.c.store.execute(pipe)[-1], written  # type: ignore[attr-defined]
        finally:
            pipe.reset()

    def _send_released(self, job_id: str, keys: JobKeys, released: list[tuple[str, ...]],
                       resumed: bool, pipe: Any = None,
                       unsettled: tuple[float, float | None] = (0.0, None),
                       specs: list[dict[str, Any]] | None = None) -> list[str]:
        """Publish each released successor, then confirm the sends and settle the backlog
        and pending counters in one pipeline (also for the ones sent before a failure).
        ``unsettled``: the finished task's charge and when it came off in Redis (None: not
        yet); ``specs``: the successors' records, decoded already (else decoded here)."""
        c = self.c
        sent: list[tuple[str, str, Decision, dict[str, Any] | None]] = []
        if specs is None:
            specs = [json.loads(r[2]) for r in released]
        try:
            self._publish_released(job_id, released, specs, unsettled, sent)
        finally:
            if sent:
                pipe = pipe if pipe is not None else c.store.client.pipeline(transaction=False)
                pipe.hset(keys.tasks, mapping={succ: tid for succ, tid, _, _ in sent})
                for _, _, decision, planned in sent:
                    # the next re-placement here sees it before the next read
                    ledger.charge(c, decision, pipe=pipe)
                    if planned and planned.get("worker") not in (None, SHARED) and not resumed:
                        ledger.plan(c, planned["worker"], planned_charge_ms(planned),
                                    planned.get("level"), -1, pipe)  # no longer pending
                c.store.execute(pipe)  # type: ignore[attr-defined]
        return [tid for _, tid, _, _ in sent]

    def _publish_released(self, job_id: str, released: list[tuple[str, ...]],
                          specs: list[dict[str, Any]], unsettled: tuple[float, float | None],
                          sent: list[tuple[str, str, Decision, dict[str, Any] | None]]
                          ) -> None:
        """Place and publish each released successor, adding each one sent to ``sent``
        (to confirm). Several successors' pushes go in one round trip: if that fails,
        none of them counts as sent (a resumed completion sends them again); an error
        before it leaves those already placed to be sent and confirmed."""
        with held_pushes() if len(released) > 1 else contextlib.nullcontext() as held:
            try:
                for (succ, task_id, _, plan, where), spec in zip(released, specs,
                                                                 strict=True):
                    planned = json.loads(plan) if plan else None
                    decision = self._send_successor(job_id, succ, task_id, spec, planned,
                                                    json.loads(where), unsettled)
                    sent.append((succ, task_id, decision, planned))
            finally:
                if held is not None:
                    try:
                        held.send()
                    except BaseException:
                        sent.clear()
                        raise

    def _send_successor(self, job_id: str, succ: str, task_id: str, node: dict[str, Any],
                        planned: dict[str, Any] | None, where: dict[str, float],
                        unsettled: tuple[float, float | None] = (0.0, None)) -> Decision:
        """Re-check the successor's placement against fresh state (the adjustment phase)
        and publish it to its worker's queue under its claimed task id. ``unsettled``: the
        finished task's charge, and when Redis took it off (None: not yet)."""
        c = self.c
        placement: Any = planned
        moved_from = None
        # read ahead, as producers do: a successor waits for no read (retries do); but one
        # with a deadline is placed on state no older than the TTL, as the simulator places
        # it on its worker's current record: traced at 8 jobs/s, a snapshot read ahead
        # (67-91 real ms old) showed a worker free that had started a batch task since
        try:
            snapshot = c.reader.get(successor_read_ahead_s(
                node, c.settings.snapshot_refresh_ahead_s))
        except StateUnavailable:
            snapshot = None  # no fresh state to judge by: keep the plan
        better = None
        if snapshot is not None:
            workers = snapshot.workers
            unsettled_ms, settled_at = unsettled
            # the finished task's charge, not yet off in Redis when this snapshot was read
            if unsettled_ms and (settled_at is None or snapshot.taken_at < settled_at):
                workers = tuple(settled(w, unsettled_ms) if w.name == self.name else w
                                for w in workers)
            # what it would overtake, and a worker about to take a lower-level task first
            workers = for_priority(workers, node.get("priority"),
                                   race_clock(snapshot.taken_at, c.settings.hold_max_ms),
                                   sender=self.name)
            planned_worker = planned["worker"] if planned else ""
            # its record: a plan that still holds is kept without building the cluster view
            record = next((w for w in workers if w.name == planned_worker), None)
            better = choose_successor(
                TaskSpec(succ, node["model"], node["exec_ms"], node["output_kb"],
                         batch=batch_from_record(node.get("batch"))
                         if c.settings.batch_aware else None),
                planned_worker,
                lambda: ClusterView.of(workers, c.model_sizes(), snapshot.taken_at,
                                       demand=cluster_demand(workers),
                                       load_ms=learned_loads(snapshot.profiles)),
                where, factor=c.settings.move_factor, is_join=len(node["preds"]) > 1,
                adjusts=c.policy.adjusts, planned=record, now=snapshot.taken_at)
        if better is not None:
            moved_from = planned["worker"] if planned else None
            placement = better
            from ..signals import task_reassigned

            task_reassigned.send(sender=c, job_id=job_id, node=succ, old=moved_from,
                                 new=better.worker)
        ref = {INPUT_REF: {"preds": node["preds"], "single": len(node["preds"]) == 1}}
        decision = publish_node(c, job_id, succ, node, placement, ref, moved_from, task_id,
                                planned=(planned or {}).get("worker"), remember=False)
        if trace.enabled():
            trace.event("send", id=task_id, job=job_id, node=succ, by=self.name,
                        level=node.get("priority"), due=node.get("due"),
                        deadline_ms=node.get("deadline_ms"), planned=planned,
                        worker=decision.worker, moved=moved_from is not None,
                        snap_taken=snapshot.taken_at if snapshot else None,
                        seen=_seen(snapshot, workers, decision.worker) if snapshot else None)
        return decision

    def _too_late(self, released: list[tuple[str, ...]],
                  specs: list[dict[str, Any]] | None = None
                  ) -> tuple[str, float, str | None] | None:
        """The first released successor that, started now, cannot meet its job's deadline
        (its record carries the due time and its planned time to the job's end), with
        that time and its task's name; ``specs``: their records, decoded already."""
        now = time.time()
        if specs is None:
            specs = [json.loads(r[2]) for r in released]
        for (succ, *_), node in zip(released, specs, strict=True):
            if node.get("tail_ms") is not None and should_shed(
                    now, node.get("due"), float(node["tail_ms"]), self.c.settings.time_scale):
                return succ, float(node["tail_ms"]), node.get("task")
        return None

    def shed(self, job: dict[str, Any], task_id: str, task: str | None = None,
             node: str | None = None, released: list[tuple[str, ...]] = (),
             tail_ms: float | None = None) -> str:
        """Fail a job that can no longer meet its deadline, before its next node runs:
        ``released`` successors are not sent, and their planned work is given back.
        ``tail_ms`` is the planned time from that node's start to the job's end (default:
        the header's, for the node ``job`` describes)."""
        from ..signals import task_shed

        where = node or job["node"]
        state = fail_job(self.c, job["id"], {
            "job": job["id"], "node": where, "task": task, "task_id": task_id,
            "worker": self.name, "exc_type": "DeadlineMissed",
            "exc": f"shed before node {where!r} ran: starting it now could no longer meet "
                   f"the job's deadline", "why": "deadline"})
        self._failed_here(job["id"])
        for _, _, _, plan, _ in released:  # released, so fail_job does not count them
            planned = json.loads(plan) if plan else None
            if planned and planned.get("worker") not in (None, SHARED):
                ledger.plan(self.c, planned["worker"], planned_charge_ms(planned),
                            planned.get("level"), -1)
        if state == "FAILURE":
            task_shed.send(sender=self.c, job_id=job["id"], node=where, task_id=task_id,
                           slo=job.get("slo") or "")
            tail = tail_ms if tail_ms is not None else float(job.get("tail_ms") or 0.0)
            self._learn_plan_error(job, time.time() + tail * self.c.settings.time_scale
                                   / 1000)
        return state

    def _deadline_outcome(self, job: dict[str, Any], finished: float) -> None:
        """Say whether a job with a deadline, which just ended here, met it, and teach
        admission how late against its plan it ran."""
        if not job.get("due"):
            return
        from ..signals import job_deadline_outcome

        late_ms = 1000 * (finished - float(job["due"])) / self.c.settings.time_scale
        job_deadline_outcome.send(sender=self.c, job_id=job["id"], slo=job.get("slo") or "",
                                  met=late_ms <= 0, late_ms=late_ms)
        self._learn_plan_error(job, finished)

    def _learn_plan_error(self, job: dict[str, Any], end: float) -> None:
        """Fold (measured - predicted) job finish into its class's learned quantile, the
        margin admission adds to the next plans (best effort). A shed job counts with
        the end it could at best have had."""
        plan_end = float(job.get("plan_end") or 0.0)
        if not plan_end:
            return
        error_ms = 1000 * (end - plan_end) / self.c.settings.time_scale
        with contextlib.suppress(StateUnavailable, RedisError, OSError):
            self.c.store.record_plan_error(job.get("slo") or "", error_ms, ERROR_QUANTILE,
                                           error_step_ms(job.get("deadline_ms")))

    def fail(self, job: dict[str, Any], task_id: str, exc: BaseException, why: str = "",
             task: str | None = None) -> str:
        """Fail the job once (fail.lua), revoke its outstanding tasks, release pending."""
        self._failed_here(job["id"])  # its queued nodes here are checked again
        self.outputs.drop_job(job["id"])
        return fail_job(self.c, job["id"], {
            "job": job["id"], "node": job["node"], "task": task, "task_id": task_id,
            "worker": self.name,
            "exc_type": type(exc).__name__, "exc": str(exc)[:2000], "why": why})


def successor_read_ahead_s(node: dict[str, Any], read_ahead_s: float) -> float:
    """How much older than the reader's TTL a successor's placement may read state: none
    for a node of a job with a deadline (a task started since would hold it up past
    plan), the reader's read-ahead for others."""
    return 0.0 if node.get("due") else read_ahead_s


def _seen(snapshot: Any, workers: Any, name: str) -> dict[str, Any] | None:
    """What a successor's placement read about worker ``name`` (trace only): its backlog
    as the successor's level sees it, what of it was left at the snapshot's time, its
    running tasks and what waited per level."""
    from ..planner.cost import backlog_left_ms

    for raw, w in zip(snapshot.workers, workers, strict=True):
        if w.name == name:
            return {"backlog_ms": w.backlog_ms, "all_backlog_ms": raw.backlog_ms,
                    "left_ms": backlog_left_ms(w, snapshot.taken_at),
                    "running": [list(r) for r in w.running],
                    "queued_ms": {str(k): v for k, v in raw.queued_ms.items()},
                    "pending_ms": raw.pending_ms}
    return None
