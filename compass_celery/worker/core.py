"""What a worker decides about the tasks waiting for it, with no I/O: one home for the
rules the real worker and the simulator both follow.

- **Which waiting task runs next** (:func:`next_index`, :class:`LevelQueue`): the highest
  priority level after ageing (``planner.priority.aged``: one level up per ``age_s``
  waited), then the oldest, then the higher level it was sent at. On the real cluster
  kombu's priority sub-queues serve the levels and the broker's ``age`` (which calls
  ``aged``; ``broker/lua/promote.lua`` only moves the message, it cannot call Python)
  promotes what has waited; the simulator runs :class:`LevelQueue`.
- **Where a waiting task joins its level** (:meth:`LevelQueue.push`): a later step of a
  job with a deadline (a node with predecessors, released by one that finished) joins
  its level ahead of the first steps waiting there, behind the later steps already
  waiting (FIFO among them): its job has already spent part of its deadline, a first
  step's has not. Work without a deadline keeps one FIFO per level. On the
  real cluster a worker's send puts it there in the list (``broker/lua/push.lua``); the
  simulator runs :class:`LevelQueue`.
- **Whether to drop a task at dequeue** (:func:`drop_at_dequeue`): its latest start
  (``expires_at``, the deadline less its planned time to the job's end) has passed, as
  Celery's ``expires`` drops it on the real worker.
- **What a waiting task charges, per level** (:func:`queued_by_level`, and
  :meth:`LevelQueue.queued_ms`): the ``WorkerView.queued_ms`` a worker publishes, so
  that ``planner.priority.for_priority`` lets a task overtake what waits below it.
- **Whether to hold the slot** (:func:`slot_held_until`): which waiting task a worker
  starts next may also be "none yet". Tasks are not preemptible, so a lower-level (batch)
  task started just before a higher level's planned successor arrives delays it by up to
  a whole run; while a higher level's successor is planned on the worker (its
  ``pending_queued_ms``), the worker does not start a lower-level task, for at most
  ``compass_hold_max_ms`` from when it began holding (so batch work is delayed, never
  starved, even if a planned count leaks). Only work without a deadline is held: a
  lower-level task whose job has a deadline of its own starts as ever (admission prices
  no hold, so holding it would spend its deadline unplanned). The simulator asks here;
  the real worker's fetch (``broker/lua/fetch.lua``) skips the lists below the planned
  level by the same rule (:func:`held_below`), taking a list's next message still when
  its ``compass`` header carries a due time.
- **Whether to hold a forming batch open** (:func:`batch_close_at`, through
  ``planner.batch.hold_until_ms``, the one rule) and until when.

Times are workload ms unless a name says ``_s``; ``now`` is always passed in. Pure: no
Celery, kombu, Redis or torch, so ``compass_celery.sim`` runs it as it is.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Generic, Protocol, TypeVar

from ..planner.admission import latest_start
from ..planner.batch import BatchSpec, hold_until_ms
from ..planner.cost import MS_PER_S
from ..planner.priority import PLANNED_EPS_MS, aged


class Waiting(Protocol):
    """A task as the queue rules see it: its level, when it was sent (workload ms: its
    wait, for ageing, counts from then) and what queueing it charged its worker."""

    level: int
    sent_at: float
    charged_ms: float
    #: a later step of a job with a deadline: it waits ahead of its level's first steps
    later: bool


T = TypeVar("T", bound=Waiting)


def next_index(heads: Sequence[tuple[int, float]], now_ms: float, age_s: float) -> int:
    """Which of the waiting ``heads`` ((level, sent ms) each) runs next: the highest level
    after ageing, then the oldest, then the one listed first (deterministic).

    Levels are the RabbitMQ direction (9 most urgent); a task waits from when it was sent,
    as the real worker ages a message from its header's ``queued_at``."""
    best, best_key = 0, (-1, 0.0)
    for i, (level, sent) in enumerate(heads):
        key = (aged(level, (now_ms - sent) / MS_PER_S, age_s), -sent)
        if key > best_key:
            best, best_key = i, key
    return best


def drop_at_dequeue(now_s: float, expires_at_s: float | None) -> bool:
    """Whether a task taken off the queue at ``now_s`` is dropped unrun: it is past its
    latest start (epoch s of the worker's clock; None: it never expires), so starting it
    can no longer meet its job's deadline. Celery's ``expires`` drops it so on the real
    worker (the router stamps ``Decision.expires_at``, 0 there meaning none); the
    simulator asks here."""
    return expires_at_s is not None and now_s > expires_at_s


def expires_at_s(due_s: float | None, tail_ms: float | None) -> float | None:
    """A task's latest start (epoch s) from its job's due time and its planned time to the
    job's end (``planner.admission.latest_start``, what the router stamps as
    ``expires``); None when it has no deadline to miss."""
    if due_s is None or tail_ms is None:
        return None
    return latest_start(due_s, tail_ms)


def held_below(planned: Mapping[int, float]) -> int | None:
    """The level below which a worker holds its slot: the highest level with work planned
    on it (``pending_queued_ms``: successors of jobs that are running), None when none is."""
    return max((q for q, ms in planned.items() if ms > PLANNED_EPS_MS), default=None)


def slot_held_until(level: int, planned: Mapping[int, float], now_ms: float,
                    since_ms: float | None, hold_max_ms: float, *, sent_ms: float | None = None,
                    age_s: float = 0.0, has_deadline: bool = False) -> float | None:
    """Until when (workload ms) a worker holds its slot rather than start its next waiting
    task, of ``level`` (aged from ``sent_ms`` by ``age_s``, as :func:`next_index` ages it:
    the real worker's lists hold messages at their aged level already), while a higher
    level has work planned on it (``planned``,
    its ``pending_queued_ms``) and the hold, begun at ``since_ms`` (None: not holding
    yet, it begins now), is younger than ``hold_max_ms``. None: start the task now (no
    higher level planned, the bound passed, ``hold_max_ms`` <= 0: off, or the task
    ``has_deadline`` of its own: admission planned it to start without a hold, so only
    work without a deadline is held). The worker looks again when a task arrives,
    planned work is released, or at the time returned."""
    if hold_max_ms <= 0 or has_deadline:
        return None
    top = held_below(planned)
    if sent_ms is not None:
        level = aged(level, (now_ms - sent_ms) / MS_PER_S, age_s)
    if top is None or level >= top:
        return None
    until = (now_ms if since_ms is None else since_ms) + hold_max_ms
    return until if now_ms < until else None


def queued_by_level(charges: Iterable[tuple[int | None, float]]) -> dict[int, float]:
    """What waiting tasks ((level, charge ms) each) charge each level: what the worker
    publishes as ``WorkerView.queued_ms``. A task without a level charges none, as its
    send charged none (``ledger.waiting``)."""
    out: dict[int, float] = {}
    for level, ms in charges:
        if level is not None:
            out[level] = out.get(level, 0.0) + ms
    return out


def batch_latest_start_ms(spec: BatchSpec, exec_ms: float, speed: float, waiting: int, *,
                          due_ms: float | None = None, tail_ms: float | None = None) -> float:
    """The latest a forming batch may start (workload ms): its head's latest start (its
    job's due time less its planned time to the job's end) when it has one; else, for a
    job with a deadline it does not shed at, the deadline less one pass over what waits;
    else never (``inf``)."""
    if due_ms is None:
        return math.inf
    if tail_ms is not None:
        return due_ms - tail_ms
    return due_ms - spec.curve_for(exec_ms).of(min(waiting, spec.max_size)) / speed


def batch_close_at(now_ms: float, first_sent_ms: float, spec: BatchSpec, *, waiting: int,
                   others_ready: bool, latest_start_ms: float = math.inf) -> float | None:
    """Until when to hold a forming batch of ``waiting`` inputs open for more (a time to
    wake at), or None to close it and start now (``planner.batch.hold_until_ms``)."""
    until = hold_until_ms(first_sent_ms, spec, waiting=waiting, others_ready=others_ready,
                          latest_start_ms=latest_start_ms)
    return None if now_ms >= until else until


class LevelQueue(Generic[T]):
    """One worker's waiting tasks, a FIFO per priority level, served by
    :func:`next_index`, with what each level's tasks charge (``WorkerView.queued_ms``).

    Within a level a job's later steps wait at the front, oldest first, then its first
    steps, oldest first (``later``), so only the front of each level can be next:
    picking looks at one task per level, whatever the queue's length. Iteration (what
    the cache looks ahead at) runs level by level, most urgent first."""

    __slots__ = ("age_s", "_fifo", "_order", "_ms", "_n", "_only", "_later")

    def __init__(self, age_s: float = 0.0) -> None:
        self.age_s = age_s  # ``compass_priority_age_s``; 0: no ageing
        self._fifo: dict[int, deque[T]] = {}
        self._order: list[int] = []  # levels with waiting tasks, most urgent first
        self._ms: dict[int, float] = {}  # level -> ms its waiting tasks charged
        self._n = 0
        # the one level's FIFO while exactly one level has waiting tasks (as with no
        # priorities in play: then serving and iterating are the deque's own), else None
        self._only: deque[T] | None = None
        self._later: dict[int, int] = {}  # level -> later steps at the front of its FIFO

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[T]:
        only = self._only
        if only is not None:
            return iter(only)
        return chain.from_iterable(map(self._fifo.__getitem__, self._order))

    def push(self, item: T) -> None:
        """A task arrives, charging its level: a first step waits behind all of its
        level; a later step behind its level's later steps, ahead of its first steps."""
        level = item.level
        fifo = self._fifo.get(level)
        if fifo is None:
            fifo = self._fifo[level] = deque()
            self._ms[level] = 0.0
            self._order.append(level)
            self._order.sort(reverse=True)
            self._only = fifo if len(self._order) == 1 else None
        if item.later:
            ahead = self._later.get(level, 0)
            self._later[level] = ahead + 1
            if ahead < len(fifo):
                fifo.insert(ahead, item)
            else:
                fifo.append(item)
        else:
            fifo.append(item)
        self._ms[level] += item.charged_ms
        self._n += 1

    def peek(self, now_ms: float) -> T | None:
        """The task that runs next at ``now_ms`` (None: nothing waits)."""
        only = self._only
        if only is not None:
            return only[0]
        order = self._order
        if not order or self.age_s <= 0:
            return self._fifo[order[0]][0] if order else None
        fronts = [self._fifo[level][0] for level in order]
        return fronts[next_index([(t.level, t.sent_at) for t in fronts], now_ms, self.age_s)]

    def pop(self, now_ms: float) -> T:
        """Take off the task that runs next (the queue must not be empty)."""
        item = self.peek(now_ms)
        if item is None:
            raise IndexError("pop from an empty LevelQueue")
        self.remove(item)
        return item

    def remove(self, item: T) -> None:
        """Take a waiting task out (started, dropped, revoked): off its level's charge."""
        level = item.level
        fifo = self._fifo[level]
        if fifo[0] is item:
            fifo.popleft()
        else:
            fifo.remove(item)
        if item.later:
            self._later[level] -= 1
        if fifo:  # (``_settle``, inline: this runs for every task a worker starts)
            self._n -= 1
            left = self._ms[level] - item.charged_ms
            self._ms[level] = left if left > 0.0 else 0.0
        else:
            self._settle(level, fifo, item.charged_ms)

    def take(self, match: Callable[[T], bool], limit: int) -> list[T]:
        """Take out up to ``limit`` waiting tasks that ``match``, in iteration order (a
        batch's other members), off their levels' charges."""
        out: list[T] = []
        for level in tuple(self._order):
            if len(out) >= limit:
                break
            fifo, skipped, first = self._fifo[level], [], len(out)
            while fifo and len(out) < limit:
                t = fifo.popleft()
                (out if match(t) else skipped).append(t)
            fifo.extendleft(reversed(skipped))
            if len(out) > first:
                gone = sum(1 for t in out[first:] if t.later)
                if gone:
                    self._later[level] -= gone
                self._settle(level, fifo, sum(t.charged_ms for t in out[first:]),
                             len(out) - first)
        return out

    def _settle(self, level: int, fifo: deque[T], ms: float, n: int = 1) -> None:
        """``n`` tasks that charged ``ms`` left ``level``: the count and charge drop; an
        emptied level is gone (its charge exactly 0, not what float sums leave)."""
        self._n -= n
        if fifo:
            left = self._ms[level] - ms
            self._ms[level] = left if left > 0.0 else 0.0  # a float sum's dip below 0
        else:
            del self._fifo[level], self._ms[level]
            self._later.pop(level, None)
            order = self._order
            order.remove(level)
            self._only = self._fifo[order[0]] if len(order) == 1 else None

    def queued_ms(self) -> dict[int, float]:
        """ms charged per level by what waits (a copy: the view it goes into is frozen)."""
        return self._ms.copy()
