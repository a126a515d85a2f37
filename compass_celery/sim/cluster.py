"""Simulated GPU workers: the clock and the GPU around the real worker's rules.

What a worker decides about its waiting tasks is the real worker's core
(:mod:`compass_celery.worker.core`): which task runs next (priority level with ageing,
then the oldest), dropping a task past its latest start, what waiting tasks charge per
level (published as ``WorkerView.queued_ms``) and holding a batch open. Each worker also
runs exactly the cache code the real workers run
(:class:`~compass_celery.cache.decisions.CacheDecider`) and executes its
``Load``/``Evict`` actions with load times from the workload (host-RAM tier at
``host_load_mb_per_s``, storage at ``load_mb_per_s``, one load at a time).
Celery-default mode is one shared queue (by priority, as kombu's sub-queues serve it;
the ageing runs on a worker's own queue only) from which idle workers take the next
ready task, the way prefetch-one Celery workers pull from a broker.

A batchable task (``TaskSpec.batch``, ``planner.batch``) is run with up to
``max_size - 1`` more queued tasks of the same task and model, as one pass timed by the
batch curve; the worker may hold a batch open for more (``batch.hold_until_ms``). Under
``batching="on"`` a worker publishes how many inputs of each batch key wait in its queue,
as a real worker's counters do (the planner reads the forming batch from the count, the
same rule on both), and charges each task what it adds to its batch; under ``"blind"`` it
batches all the same but publishes as an unbatched worker (every task at its full run
time, no counts).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, overload

from ..cache.decisions import CacheDecider, Evict
from ..cache.errors import CacheFullError
from ..cache.host_tier import HostTier
from ..planner.batch import BatchSpec, batch_key, marginal_ms
from ..planner.cost import (
    KB_PER_MB,
    MS_PER_S,
    WorkerArrays,
    evolve,
    remember_arrays,
    with_rows,
    worker_arrays,
)
from ..planner.demand import DemandTracker
from ..planner.evict import eviction_rank
from ..planner.pending import send_charge_ms
from ..planner.priority import DEFAULT_PRIORITY, ahead_ms, planned_ahead_ms
from ..planner.types import SHARED, ClusterView, WorkerView
from ..worker.core import (
    LevelQueue,
    batch_close_at,
    batch_latest_start_ms,
    drop_at_dequeue,
    expires_at_s,
    slot_held_until,
)
from ..workload import WorkerSpec
from .columns import LiveColumns
from .engine import Engine
from .hops import MeasuredHops

PREFETCH_LOOKAHEAD = 3  # queued tasks whose models are prefetched, as in the authors' code


@dataclass(eq=False)
class SimTask:
    """One task of one job on its way through the cluster."""

    job: Any
    node: str
    model: str | None
    exec_ms: float
    inputs: list[tuple[str, float]] = field(default_factory=list)  # (producer worker, KB)
    ready_at: float = 0.0
    expected_ms: float = 0.0
    seen: bool = False
    # Moments (workload ms) for the per-task breakdown: sent to a queue, the worker turned
    # to it (free, task at the head), its model was resident, it started; -1 = not yet.
    sent_at: float = -1.0
    turn_at: float = -1.0
    model_at: float = -1.0
    start_at: float = -1.0
    # Its job's deadline (epoch s of the simulated clock, workload ms / 1000) and its
    # planned time to the job's end: a worker drops it unrun once starting it can no
    # longer meet the deadline (``planner.admission.should_shed``, as a real worker's
    # ``expires``). None: it never expires.
    due_s: float | None = None
    tail_ms: float | None = None
    #: The worker whose queue holds it (None: the shared queue, or not sent yet).
    where: SimWorker | None = None
    dropped: bool = False
    #: Run with queued tasks of the same key as one pass (None: one at a time).
    batch: BatchSpec | None = None
    key: str = ""
    #: What queueing it added to its worker's backlog (its run time, or under batching
    #: what it adds to its batch), taken off again when it leaves the queue.
    charged_ms: float = 0.0
    hop_ms: float = 0.0  # the per-task cost its worker paid beyond its run (drawn or fixed)
    #: ms it waited while its worker held its batch open for more (0: none).
    held_ms: float = 0.0
    batch_size: int = 0  # inputs in the pass it ran in (0: not batched)
    #: Its priority level, 0..9 (9 most urgent): its job's class's, as the router gives it.
    level: int = DEFAULT_PRIORITY
    #: A later step of a job with a deadline (it has predecessors): it waits ahead of its
    #: level's first steps (``worker.core.LevelQueue``).
    later: bool = False


class SimWorker:
    """One worker: a queue by priority and age (``worker.core``), one task at a time,
    loads overlapped with runs by prefetch."""

    def __init__(self, spec: WorkerSpec, engine: Engine, sizes: Mapping[str, float],
                 cache_policy: str, cluster: SimCluster, hop_ms: float = 0.0,
                 batching: str = "on", plan_hop: bool = True, age_s: float = 0.0,
                 hold_max_ms: float = 0.0) -> None:
        self.spec, self.engine, self.cluster = spec, engine, cluster
        # the held slot's bound (``compass_hold_max_ms``; 0: off), and when the current
        # hold began (-1: not holding) and is to end (a wake-up is set then)
        self.hold_max_ms = hold_max_ms
        self.slot_held_from = self.slot_held_at = -1.0
        # what its record says of the hop (a real worker learns it from its gaps), which
        # plans count and sends charge; 0 when plans are to leave it out. What each task
        # pays, occupying the worker, is the cluster's to say (``SimCluster.draw_hop``).
        self.published_hop_ms = hop_ms if plan_hop else 0.0
        # its record's fields that never change (name, hardware, the hop it publishes),
        # which each new record (``view``) shares
        self._fixed = WorkerView(
            name=spec.name, queue=spec.name, gpu_total_mb=spec.gpu_mem_mb,
            gpu_free_mb=spec.gpu_mem_mb, speed=spec.speed, load_mb_per_s=spec.load_mb_per_s,
            host_load_mb_per_s=spec.host_load_mb_per_s, net_mb_per_s=spec.net_mb_per_s,
            hop_ms=self.published_hop_ms)
        self.name = spec.name
        self.index = 0  # position in the cluster's snapshot, set by SimCluster
        self.sizes = sizes
        self.decider = CacheDecider(spec.gpu_mem_mb, cache_policy, sizes=sizes)
        self.prefetching = cache_policy != "lru"
        self.host = HostTier(spec.host_mem_mb)  # the emulated GPU's tier, same rules
        # waiting tasks, served by the real worker's rule; ``age_s`` is its ageing period
        self.queue: LevelQueue[SimTask] = LevelQueue(age_s)
        self.queued_models: dict[str, int] = {}  # model -> queued tasks that need it
        self.running: SimTask | None = None
        self.backlog_ms = 0.0  # expected run time of queued + running tasks
        self.pending_ms = 0.0  # planned here, not yet sent
        self.pending_levels: dict[int, float] = {}  # the part of it planned at each level
        self.load_free_at = 0.0
        self.wake_at = -1.0
        self.loads = self.hits = self.misses = 0
        self.load_at: list[float] = []  # when each load started, workload ms
        self.in_flight: dict[str, tuple[float, float]] = {}  # loads under way: (began, ends)
        self.listed_idle = False  # in the cluster's idle list (celery-default)
        self.settling = False  # a settle() is scheduled
        self._view: WorkerView | None = None
        self._memory: WorkerView | None = None  # the record's memory fields (view)
        # Batching: "on" publishes its counts of waiting inputs and charges marginal costs;
        # "blind" batches but publishes as an unbatched worker does.
        self.aware = batching == "on"
        self.keyed: dict[str, int] = {}  # batch key -> queued tasks with that key
        self.members: list[SimTask] = []  # the running batch (empty: not batching)
        self.batch_ms = 0.0  # the running batch's pass
        self.hold_at = -1.0  # a hold's end is scheduled at this time
        self.hold_from = -1.0  # when the current hold began (-1: not holding)

    # -- bookkeeping --------------------------------------------------------
    def touch(self) -> None:
        """Mark this worker changed, so the next snapshot re-reads it."""
        self._view = None
        if self.index >= 0:  # -1: retired (draining), out of the snapshot
            self.cluster.dirty.add(self.index)

    def view(self) -> WorkerView:
        """This worker's record as a real worker would publish it (cached until touched):
        its fixed fields' record with the changing ones written (``evolve``; the frozen
        dataclass's constructor cost more than the rest of a snapshot at 1,000 workers).
        The memory fields come from :meth:`_memory_view`, re-read only when the cache's
        state changed (most changes are backlog charges)."""
        if self._view is None:
            backlog, pending, memory, running = self.record_parts()
            self._view = evolve(
                memory, backlog_ms=backlog, pending_ms=pending,
                pending_queued_ms={q: ms for q, ms in self.pending_levels.items() if ms > 0},
                queued_inputs=dict(self.keyed) if self.keyed and self.aware else {},
                queued_ms=self.queue.queued_ms(), running=running)
        return self._view

    def record_parts(self) -> tuple[float, float, WorkerView,
                                    tuple[tuple[float, float, float], ...]]:
        """The fields of :meth:`view` the planner's columns read (``LiveColumns.update_row``):
        backlog, planned work, the memory fields' record and what runs. A snapshot's
        columns need only these; the whole record is built when a row is read."""
        return (max(self.backlog_ms, 0.0), max(self.pending_ms, 0.0), self._memory_view(),
                self._running_span())

    def _memory_view(self) -> WorkerView:
        """The fixed fields' record with what the cache holds written (free memory, the
        resident and host-tier sets, the loads under way): kept until the cache's state
        changes (:meth:`_recache`), so successive views share those values."""
        if self._memory is None:
            d = self.decider
            self._memory = evolve(
                self._fixed, gpu_free_mb=d.free_mb(), resident=frozenset(d.resident),
                host_resident=frozenset(self.host), loading=dict(self.in_flight))
        return self._memory

    def _recache(self) -> None:
        """The cache's state (resident, loading, host tier) changed: the next view
        re-reads it."""
        self._memory = None
        self.touch()

    def _running_span(self) -> tuple[tuple[float, float, float], ...]:
        """What runs now as a real worker publishes it: when it began, when its charge
        says it ends, and that charge (a batched pass: the whole pass, charged as one)."""
        task = self.running
        if task is None:
            return ()
        charge = self.batch_ms if self.members else task.charged_ms
        return ((task.start_at, task.start_at + charge, charge),)

    def preload(self, models: Iterable[str]) -> None:
        """Make ``models`` resident before the run, pinned: never evicted, no load counted
        (the static-replicas reference's assignment)."""
        names = tuple(models)
        for model in names:
            self.decider.on_loaded(model, now=self.engine.now)
        self.decider.pinned = self.decider.pinned | frozenset(names)
        self._recache()

    def warm(self, models: Iterable[str]) -> None:
        """Make ``models`` resident before the run, unpinned and with no load counted: a
        cluster that has been serving for a while (cold, a deadline shorter than a model's
        load refuses every job that needs it, so it is never loaded)."""
        for model in models:
            self.decider.on_loaded(model, now=self.engine.now)
        self._recache()

    def load(self, models: Iterable[str]) -> None:
        """Start loading ``models`` now, one after another, as a new worker does with its
        preload hint (``planner.scaling``); each load counts and takes its time."""
        for model in models:
            if model not in self.decider.resident and model not in self.decider.loading:
                self._apply(self.decider.on_need(model, queued=[], now=self.engine.now))

    def add_pending(self, ms: float, level: int | None = None) -> None:
        """Charge (or with a negative ``ms``, release) planned-not-sent work, at its
        priority ``level`` too (``ledger.planned``, as a real submission does)."""
        self.pending_ms += ms
        if level is not None:
            self.pending_levels[level] = self.pending_levels.get(level, 0.0) + ms
        self.touch()
        if ms < 0 and self.slot_held_from >= 0 and self.running is None \
                and not self.settling:
            # a held slot looks again when planned work is released: after this instant's
            # other events, so the successor sent with the release is queued by then
            self.settling = True
            self.engine.at(self.engine.now, self.settle)

    # -- queue --------------------------------------------------------------
    def enqueue(self, task: SimTask) -> None:
        """Accept a task; its remote inputs travel with the message at network speed."""
        now = self.engine.now
        kb = sum(k for where, k in task.inputs if where != self.name)
        task.ready_at = now + kb / KB_PER_MB / self.spec.net_mb_per_s * MS_PER_S
        task.expected_ms = task.exec_ms / self.spec.speed
        task.charged_ms = send_charge_ms(task.expected_ms, self.published_hop_ms)  # as a real send
        task.where = self
        if task.batch is not None:
            self._join(task)
        self.backlog_ms += task.charged_ms
        self.queue.push(task)
        if task.model is not None:
            self.queued_models[task.model] = self.queued_models.get(task.model, 0) + 1
        self.touch()
        if self.running is None:
            self.try_start()
        elif self.prefetching:
            self._hint()
            self._apply(self.decider.prefetch(self._queued(), running=self.running.model,
                                              lookahead=PREFETCH_LOOKAHEAD, now=now))

    def _join(self, task: SimTask) -> None:
        """Count a batchable task into its key's open batch (a new one when full); aware,
        charge what it adds to that batch rather than a whole run."""
        spec = task.batch
        assert spec is not None
        key = task.key = batch_key(task.node, task.model)
        count = self.keyed.get(key, 0)
        self.keyed[key] = count + 1
        if self.aware:
            curve = spec.curve_for(task.exec_ms)
            task.charged_ms = marginal_ms(curve, count % spec.max_size) / self.spec.speed

    def _unkey(self, task: SimTask) -> None:
        """A batchable task left the queue (started, claimed, dropped)."""
        if task.batch is None:
            return
        left = self.keyed[task.key] - 1
        if left:
            self.keyed[task.key] = left
        else:
            del self.keyed[task.key]

    def _queued(self, skip: SimTask | None = None) -> list[str | None]:
        """The queued tasks' models in the order they are served (all but ``skip``, the
        task about to start), for the cache decider.

        The decider reads only the first ``PREFETCH_LOOKAHEAD`` entries and where each
        model is first needed, so the list stops once it holds both: the same decisions
        as the whole queue, without a pass over a queue thousands of tasks long.
        """
        counts = self.queued_models
        distinct = len(counts)
        if skip is not None:
            head = skip.model
            if head is not None and counts[head] == 1:
                distinct -= 1
        out: list[str | None] = []
        seen: set[str] = set()
        tasks: Iterator[SimTask] = iter(self.queue)
        if skip is not None:  # it is listed first unless ageing lifted it from below
            first = next(tasks, None)
            if first is not skip and first is not None:
                tasks = chain((first,), (t for t in tasks if t is not skip))
        for task in tasks:
            model = task.model
            out.append(model)
            if model is not None:
                seen.add(model)
            if len(seen) == distinct and len(out) >= PREFETCH_LOOKAHEAD:
                break
        return out

    def _pop(self, task: SimTask) -> None:
        """Take the task that runs next (``queue.peek``) off the queue."""
        self.queue.remove(task)
        self._uncount(task)

    def remove(self, task: SimTask) -> None:
        """Take a queued task out unrun (its job was revoked); the worker moves on to its
        next task at once, as a real worker skips a revoked message."""
        self.queue.remove(task)
        self._forget(task)
        if not self.settling:
            self.settling = True
            self.engine.at(self.engine.now, self.settle)

    def _uncount(self, task: SimTask) -> None:
        """A task leaves the queue: off the queued-model counts and its forming batch."""
        if task.model is not None:
            left = self.queued_models[task.model] - 1
            if left:
                self.queued_models[task.model] = left
            else:
                del self.queued_models[task.model]
        self._unkey(task)

    def _forget(self, task: SimTask) -> None:
        """Undo a queued task's bookkeeping (model count, backlog)."""
        self._uncount(task)
        self.backlog_ms -= task.charged_ms
        task.where = None
        self.touch()

    def settle(self) -> None:
        """After tasks were taken out: start the next one, or go idle."""
        self.settling = False
        if self.running is not None:
            return
        if self.queue:
            self.try_start()
        elif not self.listed_idle:
            self.cluster.on_idle(self)

    def _drop_expired(self) -> bool:
        """Drop head tasks that can no longer meet their job's deadline, unrun (the
        planner's own rule, ``should_shed``); True when that emptied the queue (the worker
        then went idle and there is nothing to start). A task the worker has turned to
        already is not judged again: a real worker checks ``expires`` once, when it takes
        the message, and loads the model inside the task (judged again once its load was
        in, a task taken in time was dropped although its tail counted that load)."""
        dropped, now = False, self.engine.now
        while self.queue:
            task = self.queue.peek(now)
            assert task is not None
            if task.tail_ms is None or task.turn_at >= 0 or not drop_at_dequeue(
                    now / MS_PER_S, expires_at_s(task.due_s, task.tail_ms)):
                break
            self.queue.remove(task)
            self._forget(task)
            task.dropped = dropped = True
            self.cluster.dropped += 1
            self.cluster.on_shed(task, self)
        if dropped and not self.queue and self.running is None:
            if not self.listed_idle:
                self.cluster.on_idle(self)
            return True
        return False

    def try_start(self) -> None:
        """Start the task that runs next if its model is resident and its inputs have
        arrived (a task past its latest start is dropped first)."""
        if self.running is not None:
            return
        now = self.engine.now
        task = self.queue.peek(now)
        if task is None:
            return
        if task.tail_ms is not None:  # it has a latest start, which may have passed
            if self._drop_expired() or self.running is not None or not self.queue:
                return
            task = self.queue.peek(now)
            assert task is not None
        if self._slot_held(task):
            return
        if task.turn_at < 0:
            task.turn_at = now
        model = task.model
        if model is not None:
            if not task.seen:
                task.seen = True
                if model in self.decider.resident:
                    self.hits += 1
                else:
                    self.misses += 1
            if model not in self.decider.resident:
                if model not in self.decider.loading:
                    self._hint()
                    try:
                        actions = self.decider.on_need(model, queued=self._queued(task),
                                                       now=now)
                    except CacheFullError:
                        if not self.decider.loading:  # nothing will free memory: give up
                            self._pop(task)
                            task.where, task.dropped = None, True
                            self.backlog_ms -= task.charged_ms
                            self.touch()
                            self.cluster.on_failed(task, self)
                            if not self.queue:
                                self.cluster.on_idle(self)
                            self.try_start()
                        return
                    self._apply(actions)
                return  # the load's completion calls try_start again
        if task.model_at < 0:
            task.model_at = now
        if task.ready_at > now:
            if self.wake_at != task.ready_at:
                self.wake_at = task.ready_at
                self.engine.at(task.ready_at, self.try_start)
            return
        if task.batch is not None:
            self._start_batch(task)
            return
        self.hold_from = -1.0
        self._pop(task)
        self.running = task
        task.start_at = now
        task.where = None
        self.cluster.started += 1
        if model is not None:
            self.decider.on_used(model, now)
        # The hop (message delivery, bookkeeping round trips) keeps the worker busy too,
        # which is how a per-task overhead pushes a loaded real cluster toward saturation.
        task.hop_ms = self.cluster.draw_hop()
        self.engine.after(task.hop_ms + task.expected_ms, self._finish, task)
        if self.prefetching:
            self._hint()
            self._apply(self.decider.prefetch(self._queued(), running=model,
                                              lookahead=PREFETCH_LOOKAHEAD, now=now))
        self.touch()

    def _slot_held(self, task: SimTask) -> bool:
        """Whether to leave the slot free rather than start ``task`` now (``worker.core``'s
        ``slot_held_until``: a higher level's successor is planned here); when so, a
        wake-up is set for the bound."""
        if self.hold_max_ms <= 0:
            return False
        now = self.engine.now
        since = self.slot_held_from if self.slot_held_from >= 0 else None
        until = slot_held_until(task.level, self.pending_levels, now, since, self.hold_max_ms,
                                sent_ms=task.sent_at, age_s=self.queue.age_s,
                                has_deadline=getattr(task.job, "due", None) is not None)
        if until is None:
            self.slot_held_from = -1.0
            return False
        if since is None:
            self.slot_held_from = now
            self.cluster.slot_holds += 1
        if self.slot_held_at != until:
            self.slot_held_at = until
            self.engine.at(until, self.try_start)
        return True

    def _hold(self, head: SimTask) -> bool:
        """Whether to keep the head's batch open for more now (``worker.core``'s
        ``batch_close_at``); when so, a wake-up is set for the hold's end."""
        spec = head.batch
        assert spec is not None
        now, waiting = self.engine.now, self.keyed[head.key]
        tail = head.tail_ms if head.due_s is not None else None
        latest = batch_latest_start_ms(
            spec, head.exec_ms, self.spec.speed, waiting, tail_ms=tail,
            due_ms=head.due_s * MS_PER_S if tail is not None else getattr(head.job, "due", None))
        until = batch_close_at(now, head.sent_at, spec, waiting=waiting,
                               others_ready=len(self.queue) > waiting, latest_start_ms=latest)
        if until is None:
            return False
        if self.hold_from < 0:
            self.hold_from = now
        if self.hold_at != until:
            self.hold_at = until
            self.engine.at(until, self.try_start)
        return True

    def _start_batch(self, head: SimTask) -> None:
        """Run the head with up to ``max_size - 1`` ready queued tasks of its key as one
        pass, or hold the batch open for more first."""
        spec = head.batch
        assert spec is not None
        if self._hold(head):
            return
        now = self.engine.now
        held_from, self.hold_from, self.hold_at = self.hold_from, -1.0, -1.0
        self._pop(head)
        members = [head]
        want = min(spec.max_size - 1, self.keyed.get(head.key, 0))
        if want:
            key = head.key
            members += self.queue.take(lambda t: t.key == key and t.ready_at <= now, want)
            for t in members[1:]:
                if t.model is not None:
                    self.queued_models[t.model] -= 1
                    if not self.queued_models[t.model]:
                        del self.queued_models[t.model]
                if not t.seen:  # its model is resident: the head just made sure
                    t.seen = True
                    self.hits += 1
                self._unkey(t)
        n = len(members)
        run = spec.curve_for(head.exec_ms).of(n) / self.spec.speed
        self.backlog_ms += run - sum(t.charged_ms for t in members)
        self.members, self.batch_ms = members, run
        self.running = head
        self.cluster.started += n
        self.cluster.batches.append(n)
        self.cluster.holds.append(now - held_from if held_from >= 0 else 0.0)
        for t in members:
            t.start_at, t.where, t.expected_ms, t.batch_size = now, None, run, n
            if t.model_at < 0:
                t.model_at = now
            t.held_ms = max(now - max(held_from, t.sent_at), 0.0) if held_from >= 0 else 0.0
        if head.model is not None:
            self.decider.on_used(head.model, now)
        hop = self.cluster.draw_hop()
        for t in members:
            t.hop_ms = hop
        self.engine.after(hop + run, self._finish_batch)
        if self.prefetching:
            self._hint()
            self._apply(self.decider.prefetch(self._queued(), running=head.model,
                                              lookahead=PREFETCH_LOOKAHEAD, now=now))
        self.touch()

    def _finish_batch(self) -> None:
        """The pass is over: every input in it is done at once."""
        members, self.members = self.members, []
        self.running = None
        self.backlog_ms -= self.batch_ms
        self.touch()
        for t in members:
            self.cluster.on_done(t, self)
        if not self.queue and self.running is None:
            self.cluster.on_idle(self)
        self.try_start()

    def _finish(self, task: SimTask) -> None:
        self.running = None
        self.backlog_ms -= task.charged_ms
        self.touch()
        self.cluster.on_done(task, self)
        if not self.queue:
            self.cluster.on_idle(self)
        self.try_start()

    # -- model loads --------------------------------------------------------
    def _apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Evict):
                self.host.add(action.name, self.sizes.get(action.name, 0.0))
                continue
            s = self.spec
            bw = s.host_load_mb_per_s if action.name in self.host else s.load_mb_per_s
            start = max(self.engine.now, self.load_free_at)
            self.load_free_at = start + action.size_mb / bw * MS_PER_S
            self.loads += 1
            self.load_at.append(start)
            self.in_flight[action.name] = (start, self.load_free_at)
            self.engine.at(self.load_free_at, self._loaded, action.name)
        if actions:  # the decider changes its state only with the actions it returns
            self._recache()

    def _hint(self) -> None:
        """Tell the cache which copies the cluster can spare (``planner.evict``), from the
        snapshot the planners last saw, as a real worker would from the state it reads."""
        if self.prefetching and self.cluster.demand is not None:
            self.decider.rank = eviction_rank(self.cluster.last_snapshot())

    def _loaded(self, name: str) -> None:
        self.in_flight.pop(name, None)
        self._hint()
        running = self.running.model if self.running else None
        extra = self.decider.on_loaded(name, now=self.engine.now, queued=self._queued(),
                                       protect=[running] if running else [])
        self.host.discard(name)
        self._apply(extra)
        self._recache()
        self.try_start()


class Records(Sequence[WorkerView]):
    """A fresh snapshot's workers (``ClusterView.workers``), each record built when it is
    read: a snapshot's columns are written from the changed workers' fields alone
    (``LiveColumns.update_row``), and most records are never read (a simulated plan reads
    the columns), so building every changed worker's record for each snapshot was half
    its cost. A record is built from the worker as it is now, which is the record of
    the snapshot only while the worker has not changed since: a read after that (the
    worker changed, or a newer snapshot was built) raises instead of answering wrong."""

    __slots__ = ("_views", "_workers", "_dirty", "_live", "read")

    def __init__(self, views: list[WorkerView | None], workers: list[SimWorker],
                 dirty: set[int]) -> None:
        self._views, self._workers, self._dirty = views, workers, dirty
        self._live = True
        #: Whether a record was read: the next snapshot is then built whole (a plan that
        #: reads records, as a batching plan reads every forming batch, reads them again).
        self.read = False

    def expire(self) -> None:
        """A newer snapshot was built: the records not built yet can no longer be."""
        self._live = False

    def __len__(self) -> int:
        return len(self._views)

    @overload
    def __getitem__(self, i: int) -> WorkerView: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[WorkerView, ...]: ...
    def __getitem__(self, i: int | slice) -> WorkerView | tuple[WorkerView, ...]:
        if isinstance(i, slice):
            return tuple(self[k] for k in range(len(self))[i])
        self.read = True
        view = self._views[i]
        if view is None:
            k = i % len(self._views) if i < 0 else i
            if not self._live or k in self._dirty:
                raise RuntimeError("a simulated snapshot's record read after its worker "
                                   "changed: read the snapshot before the next event")
            view = self._views[k] = self._workers[k].view()
        return view

    def __iter__(self) -> Iterator[WorkerView]:
        """Every record: the missing ones built in one pass, then the list's own iterator
        (a batching plan reads every worker's forming batch; a read per item through
        ``__getitem__`` made its plan 10% slower than the eager tuple)."""
        views = self._views
        self.read = True
        if None in views:
            for k, view in enumerate(views):
                if view is None:
                    self[k]  # noqa: B018 (builds it, or raises where it cannot)
        return iter(views)  # type: ignore[arg-type]


@dataclass(eq=False)
class Leveled:
    """The cluster as a task of one priority level sees it (``planner.priority``'s
    ``for_priority``), kept up to date row by row as the snapshot is: the work queued
    below the level is left out of each worker's backlog."""

    views: list[WorkerView]  # each worker as the level sees it
    arrays: WorkerArrays  # their columns, as ``build_worker_arrays`` would build them
    stale: set[int]  # rows re-read into the snapshot since these were brought up to it
    lowered: set[int] = field(default_factory=set)  # rows with work queued below the level
    snapshot: ClusterView | None = None  # the snapshot they were brought up to
    view: ClusterView | None = None  # what a plan at the level is given


class SimCluster:
    """The workers, the shared queue (celery-default) and a cached snapshot for planning."""

    def __init__(self, specs: tuple[WorkerSpec, ...], engine: Engine, sizes: Mapping[str, float],
                 *, shared: bool, on_done: Callable[[SimTask, SimWorker], None],
                 on_failed: Callable[[SimTask, SimWorker], None], refresh_ms: float = 0.0,
                 hop_ms: float = 0.0, demand: DemandTracker | None = None,
                 on_shed: Callable[[SimTask, SimWorker], None] | None = None,
                 batching: str = "on", plan_hop: bool = True,
                 measured_hops: MeasuredHops | None = None, seed: int = 0,
                 age_s: float = 0.0, hold_max_ms: float = 0.0) -> None:
        self.engine, self.sizes, self.shared = engine, dict(sizes), shared
        self.demand = demand  # fed by the producer (Simulation) with every arriving job
        self.on_done, self.on_failed = on_done, on_failed
        self.on_shed = on_shed if on_shed is not None else on_failed
        # Tasks started; dropped unrun at their latest start; revoked from the queues with
        # their shed job; withheld (released too late to meet the deadline: never sent).
        self.started = self.dropped = self.revoked = self.withheld = 0
        self.slot_holds = 0  # holds begun (``worker.core.slot_held_until``)
        self.dirty: set[int] = set()
        self.refresh_ms = refresh_ms
        self._built_at = 0.0
        # each task's cost beyond its run: drawn from measured ones, else the fixed hop
        # (published by the workers and counted by plans either way: ``hop_ms``)
        self.draw_hop: Callable[[], float] = (
            measured_hops.sampler(seed) if measured_hops is not None else lambda: hop_ms)
        policy = "lru" if shared else "lookahead"
        ordered = sorted(specs, key=lambda s: s.name)

        def make(spec: WorkerSpec) -> SimWorker:
            return SimWorker(spec, engine, sizes, policy, self, hop_ms, batching, plan_hop,
                             age_s, hold_max_ms)

        self._make = make
        #: Called with a retired worker once it has run everything it held (``retire``).
        self.on_drained: Callable[[SimWorker], None] | None = None
        self.workers = [self._make(s) for s in ordered]
        self.batches: list[int] = []  # inputs per batched pass, in start order
        self.holds: list[float] = []  # ms each batched pass was held open for more
        self.by_name = {w.name: w for w in self.workers}
        for i, w in enumerate(self.workers):
            w.index = i
        # by priority, no ageing: the real workers age only their own queues
        self.shared_queue: LevelQueue[SimTask] = LevelQueue()
        self.idle: deque[SimWorker] = deque(self.workers) if shared else deque()
        for w in self.idle:
            w.listed_idle = True
        self._views: list[WorkerView | None] = [w.view() for w in self.workers]
        self.columns = LiveColumns(self._views, self.sizes)
        self.dirty.clear()
        self._snapshot: ClusterView | None = None
        self._records: Records | None = None  # the last snapshot's records, built on read
        self._levels: dict[int, Leveled] = {}  # priority level -> the cluster as it sees it

    def preload(self, models_by_worker: Mapping[str, Iterable[str]]) -> None:
        """Load and pin each worker's models before the first job (see SimWorker.preload)."""
        for worker, models in models_by_worker.items():
            self.by_name[worker].preload(models)

    def warm(self, models_by_worker: Mapping[str, Iterable[str]]) -> None:
        """Load each worker's models before the first job, unpinned (SimWorker.warm)."""
        for worker, models in models_by_worker.items():
            self.by_name[worker].warm(models)

    def snapshot(self) -> ClusterView:
        """A consistent ClusterView; only workers that changed are re-read.

        The same object is returned while nothing changed, or for ``refresh_ms``
        after the last rebuild (workers publish state at most that often), so the
        planner's per-snapshot column cache is reused; ``now`` is the time of the call
        (a plan counts only what is left of the tasks running then).
        Changed workers' rows of the live columns are rewritten too, and the new
        snapshot gets a copy of them, so planning never walks every worker.
        """
        stale = self.engine.now - self._built_at >= self.refresh_ms
        if self._snapshot is None or (self.dirty and stale):
            self._built_at = self.engine.now
            views, workers, columns = self._views, self.workers, self.columns
            if self.refresh_ms > 0:  # a stale view is read later on purpose: every record
                for i in self.dirty:
                    view = views[i] = workers[i].view()
                    columns.update(i, view)
                records: Sequence[WorkerView] = tuple(views)
            else:  # a fresh view: each changed record is built when it is read (Records),
                # or now where the last snapshot's were read (its plans read records)
                whole = self._records is not None and self._records.read
                for i in self.dirty:
                    w = workers[i]
                    view = views[i] = w.view() if whole else w._view
                    if view is None:
                        columns.update_row(i, *w.record_parts())
                    else:
                        columns.update(i, view)
                if whole and None in views:  # unchanged since: its record is as it was
                    for k, view in enumerate(views):
                        if view is None:
                            views[k] = workers[k].view()
                if self._records is not None:
                    self._records.expire()
                records = self._records = Records(views.copy(), workers, self.dirty)
            for seen in self._levels.values():
                seen.stale |= self.dirty
            self.dirty.clear()
            rates = {} if self.demand is None else self.demand.rates(self.engine.now / MS_PER_S)
            self._snapshot = ClusterView(records, self.sizes, self.engine.now,  # type: ignore[arg-type]
                                         rates)
            remember_arrays(self._snapshot, columns.arrays())
        elif self._snapshot.now != self.engine.now:  # the same records, read later: what
            arrays = worker_arrays(self._snapshot)  # runs has run on (``backlog_left_ms``)
            self._snapshot = evolve(self._snapshot, now=self.engine.now)
            remember_arrays(self._snapshot, arrays)
        return self._snapshot

    def leveled(self, level: int) -> ClusterView:
        """The snapshot as a task of ``level`` sees it: each worker's backlog less what waits
        queued below ``level`` (``planner.priority.ahead_ms``), the very snapshot when
        nothing does, as ``for_priority`` gives it. Only rows re-read since the last call
        are recomputed, and their columns rewritten (``with_rows``), so a plan at a high
        level never walks every worker either."""
        snap = self.snapshot()
        seen = self._levels.get(level)
        if seen is None:
            seen = self._levels[level] = Leveled(list(snap.workers), worker_arrays(snap),
                                                 set(range(len(self.workers))))
        if seen.snapshot is snap:
            assert seen.view is not None
            return seen.view
        rows: dict[int, WorkerView] = {}
        before: dict[int, WorkerView] = {}
        for i in seen.stale:
            view = snap.workers[i]
            if any(ms for by_level in (view.queued_ms, view.pending_queued_ms)
                   for q, ms in by_level.items() if q < level):
                seen.lowered.add(i)
                view = evolve(view, backlog_ms=ahead_ms(view, level),
                              pending_ms=planned_ahead_ms(view, level))
            else:
                seen.lowered.discard(i)
            if view is not seen.views[i]:
                before[i], rows[i] = seen.views[i], view
                seen.views[i] = view
        seen.stale.clear()
        seen.arrays = with_rows(seen.arrays, rows, before)
        seen.snapshot = snap
        if not seen.lowered:
            seen.view = snap
        else:
            seen.view = ClusterView(tuple(seen.views), snap.model_sizes_mb, snap.now,
                                    snap.demand, snap.load_ms)
            remember_arrays(seen.view, seen.arrays)
        return seen.view

    def fold(self, rows: Mapping[int, WorkerView]) -> None:
        """Fold a producer's own planned loads (``planner.residency.fold_plan``'s rows) into
        the snapshot plans are given until it is rebuilt: the stale view's rows changed as
        the router's reader changes its own, until a fresher record replaces them."""
        snap = self._snapshot
        if snap is None or not rows:
            return
        before = {i: snap.workers[i] for i in rows}
        workers = list(snap.workers)
        for i, w in rows.items():
            workers[i] = w
        arrays = with_rows(worker_arrays(snap), rows, before)
        self._snapshot = evolve(snap, workers=tuple(workers))
        remember_arrays(self._snapshot, arrays)
        for seen in self._levels.values():
            seen.stale |= rows.keys()

    def last_snapshot(self) -> ClusterView:
        """The snapshot the planners saw last (built now if there is none yet)."""
        return self._snapshot if self._snapshot is not None else self.snapshot()

    def send(self, task: SimTask, worker: str) -> None:
        """Route a ready task: to a worker's own queue, or ``"*"`` to the shared queue."""
        task.sent_at = self.engine.now
        if worker != SHARED:
            self.by_name[worker].enqueue(task)
        elif self.idle:
            idle = self.idle.popleft()
            idle.listed_idle = False
            idle.enqueue(task)
        else:
            self.shared_queue.push(task)

    def join(self, spec: WorkerSpec) -> SimWorker:
        """Add a worker (an autoscaler's, ``sim.scaling``): planners see it from the next
        snapshot on."""
        worker = self._make(spec)
        self.by_name[worker.name] = worker
        self._members([*self.workers, worker])
        return worker

    def retire(self, worker: SimWorker) -> None:
        """Take ``worker`` out of the snapshot (scale-in): no plan chooses it again, it
        runs what it holds, and ``on_drained`` hears when it is done."""
        self._members([w for w in self.workers if w is not worker])
        worker.index = -1
        if worker.running is None and not worker.queue and self.on_drained is not None:
            self.on_drained(worker)

    def _members(self, workers: list[SimWorker]) -> None:
        """Rebuild the snapshot's rows for a new set of workers (joins and retirements
        are rare: a full rebuild each)."""
        self.workers = workers
        for i, w in enumerate(workers):
            w.index = i
        self._views = [w.view() for w in workers]
        self.columns = LiveColumns(self._views, self.sizes)
        self.dirty.clear()
        self._levels.clear()
        self._snapshot = None
        if self._records is not None:
            self._records.expire()

    def on_idle(self, worker: SimWorker) -> None:
        """An idle worker takes the next shared-queue task (celery-default), or waits; a
        retired one has drained."""
        if worker.index < 0 and self.on_drained is not None:
            self.on_drained(worker)
            return
        if not self.shared:
            return
        if self.shared_queue:
            worker.enqueue(self.shared_queue.pop(self.engine.now))
        else:
            worker.listed_idle = True
            self.idle.append(worker)

    def revoke(self, tasks: Iterable[SimTask]) -> None:
        """Take a failed job's queued tasks out of every queue unrun, as the real cluster
        revokes them; started ones run to the end."""
        for task in tasks:
            if task.start_at >= 0 or task.dropped:
                continue
            task.dropped = True
            self.revoked += 1
            if task.where is not None:
                task.where.remove(task)
            else:
                self.shared_queue.remove(task)

    def totals(self) -> tuple[int, int, int]:
        """(hits, misses, loads) summed over workers."""
        ws = list(self.by_name.values())  # retired ones too
        return (sum(w.hits for w in ws), sum(w.misses for w in ws), sum(w.loads for w in ws))

    def loads_since(self, t_ms: float) -> int:
        """Model loads that started at or after ``t_ms``, summed over workers."""
        return sum(1 for w in self.by_name.values() for t in w.load_at if t >= t_ms)
