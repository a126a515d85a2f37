"""How many workers the current demand needs: a capacity signal for an autoscaler.

Scaling on queue length counts messages, not seconds of work, and a queue grows only
once the workers are already behind, when the SLO is already lost. The planner knows
more: the GPU work the cluster is asked for per second, per model
(:func:`~compass_celery.planner.demand.cluster_demand`), how long each model takes to
load, and how many copies of each model the demand calls for. :func:`workers_needed`
turns that into a number of workers, by this rule:

1. **Work.** ``W`` = the GPU ms asked per second, summed over models, over the mean
   speed of the live workers (1000 = one worker busy all the time).
2. **Loads.** A model whose replica target (``demand.replica_targets``, on the
   workers' mean speed) exceeds the workers holding it now needs that many more copies
   loaded: each costs its load time (learned, or its size over the load bandwidth),
   spread over ``horizon_s``. ``L`` = that load work per second.
3. **Headroom.** A worker kept busy a share ``rho`` of its time makes a task of mean run
   time ``S`` wait about ``rho / (1 - rho) * S`` on average (M/M/1). Keeping that wait
   within what the tightest deadline ``D`` leaves after the run itself (``D - S``)
   gives ``rho <= 1 - S / D``, capped at ``max_util`` and floored at ``MIN_UTIL``.
   Without a deadline, ``rho = max_util``.
4. **Workers** = ``ceil((W + L) / (1000 * rho))``, and at least as many as the busiest
   model's replica target and as the GPU memory all the replicas take.

It is an estimate, and says so: the demand is what the workers *served* (exponentially
decayed over about 30 s), so it follows a change of load within a minute, and jobs
refused at admission or shed are not in it (watch ``compass_admission_rejected_total``
alongside it). The M/M/1 bound is per task; a job of several steps waits at each, so
for long chains lower ``max_util``. No demand at all gives 0: the autoscaler's minimum
keeps a worker warm.

Pure: no I/O, no Celery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .admission import DEFAULT_SLO_CLASSES
from .demand import DEFAULT_TAU_S, REPLICA_BUSY, cluster_demand, replica_targets
from .types import ClusterView, ModelDemand

#: The highest share of a worker's time planned for, deadline or not: bursts need room.
DEFAULT_MAX_UTIL = 0.85
#: The lowest: a deadline barely longer than a task would otherwise ask for a fleet.
MIN_UTIL = 0.2
#: Over how long the loads of missing replicas are spread (the demand's time constant:
#: the replicas the demand calls for now are those it will still call for that long).
DEFAULT_HORIZON_S = DEFAULT_TAU_S


@dataclass(frozen=True)
class CapacityNeed:
    """The workers needed, and the terms behind the number (for dashboards and tests)."""

    workers: int
    #: GPU work asked per second, in ms of the live workers' mean speed.
    work_ms_per_s: float = 0.0
    #: Loads of replicas the demand calls for and nobody holds, per second of horizon.
    load_ms_per_s: float = 0.0
    #: The share of each worker's time planned for (step 3 of the rule).
    target_util: float = DEFAULT_MAX_UTIL
    #: The most replicas any one model needs.
    by_replicas: int = 0
    #: Workers whose GPU memory holds every replica the demand calls for.
    by_memory: int = 0


def target_utilisation(service_ms: float, deadline_ms: float | None,
                       max_util: float = DEFAULT_MAX_UTIL) -> float:
    """The busy share that keeps the M/M/1 mean wait of a ``service_ms`` task within
    ``deadline_ms - service_ms``: ``1 - S / D``, within [``MIN_UTIL``, ``max_util``]."""
    if deadline_ms is None or deadline_ms <= 0 or service_ms <= 0:
        return max_util
    return min(max_util, max(MIN_UTIL, 1.0 - service_ms / deadline_ms))


def tightest_deadline_ms(classes: Mapping[str, Any] | None = None) -> float | None:
    """The shortest deadline of the SLO classes (the defaults plus ``classes``, as
    ``compass_slo_classes`` has them); None when no class has one."""
    table = {**DEFAULT_SLO_CLASSES, **(classes or {})}
    deadlines = [float(body["deadline_ms"]) for body in table.values()
                 if isinstance(body, Mapping) and body.get("deadline_ms") is not None]
    return min(deadlines, default=None)


def workers_needed(view: ClusterView, deadline_ms: float | None = None, *,
                   max_util: float = DEFAULT_MAX_UTIL, horizon_s: float = DEFAULT_HORIZON_S,
                   busy: float = REPLICA_BUSY) -> CapacityNeed:
    """The workers ``view``'s demand needs to meet ``deadline_ms`` (the tightest SLO's),
    by the rule in this module's docstring. ``view.demand`` is used when set, else the
    sum of its workers' ``served``."""
    if not 0 < max_util <= 1:
        raise ValueError(f"max_util must be in (0, 1], got {max_util!r}")
    if not horizon_s > 0:
        raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
    demand = view.demand or cluster_demand(view.workers)
    work = sum(d.ms_per_s for d in demand.values())
    tasks = sum(d.per_s for d in demand.values())
    if work <= 0 or tasks <= 0:
        return CapacityNeed(0, target_util=target_utilisation(0.0, deadline_ms, max_util))
    workers = view.workers
    speed = sum(w.speed for w in workers) / len(workers) if workers else 1.0
    bandwidth = (sum(w.load_mb_per_s for w in workers) / len(workers)) if workers else 0.0
    gpu_mb = max((w.gpu_total_mb for w in workers), default=0.0)
    work /= speed
    util = target_utilisation(work / tasks, deadline_ms, max_util)

    targets = replica_targets({m: ModelDemand(d.ms_per_s / speed, d.per_s)
                               for m, d in demand.items()}, busy=busy)
    load = 0.0
    replica_mb = 0.0
    for model, want in targets.items():
        size = float(view.model_sizes_mb.get(model, 0.0))
        replica_mb += want * size
        missing = want - sum(model in w.resident for w in workers)
        if missing > 0:
            ms = view.load_ms.get(model)
            if ms is None:
                ms = 1000.0 * size / bandwidth if bandwidth > 0 else 0.0
            load += missing * ms
    load /= horizon_s
    by_replicas = max(targets.values(), default=0)
    by_memory = math.ceil(replica_mb / gpu_mb - 1e-9) if gpu_mb > 0 else 0
    by_work = math.ceil((work + load) / (1000.0 * util) - 1e-9)
    return CapacityNeed(max(by_work, by_replicas, by_memory, 1), work, load, util,
                        by_replicas, by_memory)
