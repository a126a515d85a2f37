"""One simulation's options: the cluster, the load, and the runtime settings it models.

:func:`~compass_celery.sim.runner.simulate` and :class:`~compass_celery.sim.runner.Simulation`
take one :class:`SimOptions` instead of a long keyword list; a caller changes a few
fields with keywords (``simulate(w, ["compass"], jobs=60)`` is
``simulate(w, ["compass"], SimOptions(jobs=60))``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..planner.admission import DEFAULT_HEADROOM
from ..settings import OPTIONS
from .hops import MeasuredHops

#: The runtime's ``compass_move_factor`` default, so a simulation predicts a default cluster.
MOVE_FACTOR = float(OPTIONS["move_factor"].default)
#: The runtime's ``compass_priority_age_s`` default: a waiting task climbs a level per period.
PRIORITY_AGE_S = float(OPTIONS["priority_age_s"].default)
#: The runtime's ``compass_hold_max_ms`` default: the held slot's bound (0: off).
HOLD_MAX_MS = float(OPTIONS["hold_max_ms"].default)
#: ``batching=``: placement counts forming batches; workers batch unseen; no batching.
BATCHING = ("on", "blind", "off")


@dataclass(frozen=True)
class SimOptions:
    """What a simulation runs on and how (every field has the runtime's default).

    ``workers`` scales the workload's cluster to that many workers; ``rate`` (jobs per
    second) and ``jobs`` override its arrivals (``rate`` also sizes ``static-replicas``'
    assignment and ``warm``'s resident models). ``refresh_ms`` > 0 lets planners see state
    up to that old; 0 gives every plan the exact current state. ``hop_ms`` is a fixed
    per-task dispatch overhead that keeps the worker busy, which workers publish and plans
    count (``plan_hop`` off: plans leave it out); ``measured_hops`` draws each task's hop
    and overshoot from measured ones instead (:mod:`compass_celery.sim.hops`).
    ``count_pending`` counts planned-not-sent work in compass's backlog. ``move_factor``,
    ``admission``, ``max_queue_ms``, ``headroom``, ``priority_age_s`` and
    ``hold_max_ms`` are the runtime's ``compass_move_factor``, ``compass_admission``,
    ``compass_max_queue_ms``, ``compass_admission_headroom``, ``compass_priority_age_s``
    and ``compass_hold_max_ms``. ``demand`` feeds the
    planner the recent demand per model. ``warm`` starts every worker with the models
    ``static-replicas`` would give it resident (unpinned). ``batching`` is one of
    :data:`BATCHING`. ``warmup_frac`` of the jobs are left out of the statistics;
    ``details`` adds each policy's wall time and successors moved.
    """

    workers: int | None = None
    rate: float | None = None
    jobs: int | None = None
    count_pending: bool = True
    warmup_frac: float = 0.1
    refresh_ms: float = 0.0
    hop_ms: float = 0.0
    move_factor: float = MOVE_FACTOR
    details: bool = False
    demand: bool = True
    admission: bool = True
    max_queue_ms: float | None = None
    headroom: float = DEFAULT_HEADROOM
    warm: bool = False
    batching: str = "on"
    plan_hop: bool = True
    measured_hops: MeasuredHops | None = None
    priority_age_s: float = PRIORITY_AGE_S
    hold_max_ms: float = HOLD_MAX_MS

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"batching: expected one of {', '.join(BATCHING)}, "
                             f"got {self.batching!r}")

    @classmethod
    def of(cls, options: SimOptions | None = None,
           changes: Mapping[str, Any] | None = None) -> SimOptions:
        """``options`` (default: every default) with ``changes`` applied; an unknown
        name is a ``TypeError`` that names it."""
        base = options if options is not None else cls()
        if not changes:
            return base
        unknown = sorted(set(changes) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown simulation option(s): {', '.join(unknown)}")
        return replace(base, **changes)
