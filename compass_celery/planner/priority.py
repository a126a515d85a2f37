"""Task priorities, one meaning on every broker: 0 (lowest) to 9 (most urgent).

Celery's ``priority=`` means opposite things on its two main brokers: RabbitMQ
serves 9 first, kombu's Redis transport serves 0 first (and 0 is its default, so
an urgent task only helps once everything else is demoted). Compass fixes the
RabbitMQ direction for every task it places, maps it to what each broker needs at
publish time, and accepts named classes (``compass_priority_classes``).

The planner counts, for a task of priority ``p``, only the work that will run
before it: what is in flight plus what waits at ``p`` or above
(:func:`ahead_ms`). Waiting lower-priority work is skipped, so it could starve:
a task that has waited ``compass_priority_age_s`` is promoted one level per such
period (:func:`aged`), which bounds how long any task can be overtaken.

Tasks are not preemptible, and a plan's task lands in its worker's queue some ms after
the snapshot it was planned on: a worker about to be free then may take a lower-level
task first. Given the snapshot's clock, :func:`for_priority` charges such a worker one
lower-level task (:func:`race_ms`), unless its held slot (``worker.core``) holds that
work; it is priced where the workers hold (:func:`race_clock`), and the simulator, which
has no such delay, plans without it.

Pure: no I/O, no Celery.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .cost import backlog_left_ms, evolve
from .types import WorkerView

LOWEST, HIGHEST = 0, 9
#: A task sent without a priority is batch work: the lowest, as RabbitMQ treats it.
DEFAULT_PRIORITY = LOWEST
LEVELS = tuple(range(LOWEST, HIGHEST + 1))
DEFAULT_CLASSES: dict[str, int] = {"interactive": HIGHEST, "batch": LOWEST}
#: How much later than a plan's snapshot its task lands in the worker's queue, beyond the
#: worker's own gap between tasks (``WorkerView.hop_ms``), in ms: the plan, admission and
#: the push. A worker due to pick its next task within both may take a lower-level one
#: first (:func:`race_ms`). Traced at 8 jobs/s (docs/results/race): snapshots 3-10 ms old.
RACE_MARGIN_MS = 10.0
#: Planned ms at or below this count as none (what float sums of charges and releases
#: leave behind): the held slot's threshold, in ``worker.core`` and in the fetch script.
PLANNED_EPS_MS = 1e-6


class PriorityError(ValueError):
    """A priority that is neither a level 0..9 nor a known class name."""


def resolve_priority(value: Any, classes: Mapping[str, int] | None = None,
                     default: int = DEFAULT_PRIORITY) -> int:
    """A user's ``priority=`` (a level, a class name, or None) as a level 0..9.

    A number outside 0..9 or an unknown name raises :class:`PriorityError` naming it and
    what is allowed: a typo must not silently mean batch, nor 10 silently mean 9.
    """
    if value is None:
        return default
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        table = {**DEFAULT_CLASSES, **(classes or {})}
        if value not in table:
            raise PriorityError(f"unknown priority class {value!r}; known: "
                                f"{', '.join(sorted(table))} (or a level 0..9, 9 most urgent)")
        value = table[value]
    if isinstance(value, bool):
        raise PriorityError(f"priority must be a level 0..9 or a class name, got {value!r}")
    try:
        level = int(value)
    except (TypeError, ValueError):
        raise PriorityError(f"priority must be a level 0..9 or a class name, "
                            f"got {value!r}") from None
    if not LOWEST <= level <= HIGHEST:
        raise PriorityError(f"priority {value!r} is outside {LOWEST}..{HIGHEST} (a level "
                            f"{LOWEST}..{HIGHEST}, {HIGHEST} most urgent, or a class name)")
    return level


def broker_priority(level: int, redis: bool) -> int:
    """What to put in the message's ``priority`` property: kombu's Redis transport serves
    0 first, so it gets the mirror image; RabbitMQ serves the highest first."""
    return HIGHEST - level if redis else level


def user_priority(broker_value: Any, redis: bool) -> int:
    """A message's ``priority`` property read back as a level (the inverse of
    :func:`broker_priority`); absent means the default."""
    if broker_value is None:
        return DEFAULT_PRIORITY
    try:
        value = max(LOWEST, min(HIGHEST, int(broker_value)))
    except (TypeError, ValueError):
        return DEFAULT_PRIORITY
    return HIGHEST - value if redis else value


def aged(level: int, waited_s: float, age_s: float) -> int:
    """The ageing rule: one level up per ``age_s`` waited (0 turns it off), at most 9."""
    if age_s <= 0 or waited_s <= 0:
        return level
    return min(HIGHEST, level + int(waited_s // age_s))


def ahead_ms(worker: WorkerView, level: int) -> float:
    """The work a task of ``level`` waits for on ``worker``: its backlog (in flight and
    queued) less what waits queued below ``level``, which this task overtakes."""
    return max(0.0, worker.backlog_ms - _below(worker.queued_ms, level))


def planned_ahead_ms(worker: WorkerView, level: int) -> float:
    """The planned-but-unsent work (``pending_ms``) that will run ahead of a task of
    ``level`` on ``worker``: what is planned at ``level`` or above. A successor planned
    below it will be overtaken once it is sent, as queued work is."""
    return max(0.0, worker.pending_ms - _below(worker.pending_queued_ms, level))


def _below(by_level: Mapping[int, float], level: int) -> float:
    return sum(ms for q, ms in by_level.items() if q < level)


def race_ms(worker: WorkerView, level: int, now: float, typical_ms: float) -> float:
    """What a task of ``level`` may wait on ``worker`` beyond :func:`ahead_ms`, because the
    worker picks its next task before the task lands: when what is ahead of it (in flight
    and queued at ``level`` or above, at ``now``) ends within the worker's gap between
    tasks plus :data:`RACE_MARGIN_MS`, and lower-level work waits that the held slot
    does not hold (levels at or above the highest planned there, ``pending_queued_ms``),
    the worker may start one of those first: a task's charge, ``typical_ms`` (what runs
    in the cluster now), at most what waits. Tasks are not preemptible, so the plan
    prices that risk where the worker is about to be free, and chooses a worker (or
    refuses) where the deadline still holds. 0 when none of that applies. Callers price
    it only where the workers hold their slot (:func:`race_clock`), so work below a
    planned level is held and left out."""
    top = max((q for q, ms in worker.pending_queued_ms.items() if ms > PLANNED_EPS_MS),
              default=-1)
    unheld = sum(ms for q, ms in worker.queued_ms.items() if top <= q < level)
    if unheld <= PLANNED_EPS_MS:
        return 0.0
    left = backlog_left_ms(evolve(worker, backlog_ms=ahead_ms(worker, level)), now)
    if left > worker.hop_ms + RACE_MARGIN_MS:
        return 0.0
    return min(unheld, typical_ms) if typical_ms > 0 else unheld


def race_clock(taken_at: float, hold_max_ms: float) -> float | None:
    """The clock :func:`for_priority` prices the race with: the snapshot's (``taken_at``)
    where the workers hold their slot (``compass_hold_max_ms`` above 0, as the producer's
    app is configured), else None, no race charge. Measured at 160% on the mixed
    workload (docs/results/race), the charge cut level-9 waits behind a just-started batch
    task from 9.4 to 1.6 a run with the hold on; with it off, a plan takes every worker
    with a higher level planned as holding, and the charge was not shown to help."""
    return taken_at if hold_max_ms > 0 else None


def typical_run_ms(workers: Iterable[WorkerView]) -> float:
    """The mean charge of the tasks running on ``workers`` (0 when none runs): the
    expected length of the next one a worker starts (:func:`race_ms`)."""
    charges = [c for w in workers for _, _, c in w.running]
    return sum(charges) / len(charges) if charges else 0.0


def for_priority(workers: Iterable[WorkerView], level: int | None,
                 now: float | None = None, sender: str | None = None
                 ) -> tuple[WorkerView, ...]:
    """``workers`` as a task of ``level`` sees them (backlog = :func:`ahead_ms`, pending =
    :func:`planned_ahead_ms`); the same objects when nothing below ``level`` waits or is
    planned anywhere (no view to rebuild). Given ``now`` (the snapshot's clock), a
    worker about to be free also carries the lower-level task it may start first
    (:func:`race_ms`), but for ``sender``, the worker sending the task: its push comes
    before its own next pick."""
    workers = tuple(workers)
    if level is None or level <= LOWEST or not any(waits_below(w, level) for w in workers):
        return workers
    typical = typical_run_ms(workers) if now is not None else 0.0
    return tuple(seen_at(w, level, now, typical, sender) for w in workers)


def waits_below(worker: WorkerView, level: int) -> bool:
    """Whether work queued or planned below ``level`` waits on ``worker``
    (:func:`for_priority` rebuilds the view only when some worker has any)."""
    return any(ms for by_level in (worker.queued_ms, worker.pending_queued_ms)
               for q, ms in by_level.items() if q < level)


def seen_at(worker: WorkerView, level: int, now: float | None, typical: float,
            sender: str | None = None) -> WorkerView:
    """One row of :func:`for_priority` (``typical``: :func:`typical_run_ms` of every
    worker), for a caller that carries the rows of the workers that did not change."""
    return evolve(worker, backlog_ms=ahead_ms(worker, level) + (
                      race_ms(worker, level, now, typical)
                      if now is not None and worker.name != sender else 0.0),
                  pending_ms=planned_ahead_ms(worker, level))
