"""Pure planning: (DAG, cluster snapshot) -> a placement per task. No I/O in here.

``POLICIES`` maps the names used by ``--policies`` to factories; :func:`get_policy`
builds one. No celery, kombu, redis or torch import may appear in this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .adjust import DEFAULT_MOVE_FACTOR, reassign
from .base import Policy
from .compass import CompassPolicy
from .evaluate import evaluate
from .hash import HashPolicy
from .heft import HeftPolicy
from .jsq import JsqPolicy
from .random_policy import RandomPolicy
from .round_robin import RoundRobinPolicy
from .shared import SharedQueuePolicy
from .types import ClusterView, DagSpec, Placement, Plan, PlanningError, TaskSpec, WorkerView

# name -> factory(seed, **options)
POLICIES: dict[str, Callable[..., Policy]] = {
    "compass": lambda seed, **kw: CompassPolicy(**kw),
    "heft": lambda seed, **kw: HeftPolicy(**kw),
    "jsq": lambda seed, **kw: JsqPolicy(**kw),
    "round-robin": lambda seed, **kw: RoundRobinPolicy(**kw),
    "random": lambda seed, **kw: RandomPolicy(seed=seed, **kw),
    "hash": lambda seed, **kw: HashPolicy(**kw),
    "celery-default": lambda seed, **kw: SharedQueuePolicy(**kw),
}

#: Baselines run under another policy's planner (the benchmark and the simulator alike):
#: ``celery-expires`` is plain Celery (the shared queue) with Celery's own ``expires=`` on
#: every message at its job's arrival plus its deadline, so a task not started by then is
#: dropped unrun (and its job fails) instead of running late.
VARIANTS = {"celery-expires": "celery-default"}
#: The variant whose tasks expire at their job's deadline.
EXPIRES = "celery-expires"


def get_policy(name: str, *, seed: int = 0, **options: Any) -> Policy:
    """A fresh policy by name; ``seed`` feeds the random one, ``options`` its constructor."""
    factory = POLICIES.get(name)
    if factory is None:
        raise PlanningError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return factory(seed, **options)


__all__ = [
    "EXPIRES",
    "VARIANTS",
    "DEFAULT_MOVE_FACTOR",
    "POLICIES",
    "ClusterView",
    "CompassPolicy",
    "DagSpec",
    "HashPolicy",
    "HeftPolicy",
    "JsqPolicy",
    "Placement",
    "Plan",
    "PlanningError",
    "Policy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "SharedQueuePolicy",
    "TaskSpec",
    "WorkerView",
    "evaluate",
    "get_policy",
    "reassign",
]
