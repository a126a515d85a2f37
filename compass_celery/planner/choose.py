"""Choosing is separate from scoring (as in dask's ``decide_worker``).

:func:`candidates` narrows the workers to those whose GPU can hold the task's model;
:func:`choose` takes the minimum of a tuple objective (estimated finish, backlog,
worker index) over them, so ties break the same way on every run.
"""

from __future__ import annotations

import math

import numpy as np

from .cost import WorkerArrays
from .types import ClusterView, DagSpec, PlanningError, TaskSpec


def is_finite_nonneg(x: float) -> bool:
    """Whether ``x`` is a real number (not NaN or infinite) and not negative."""
    return isinstance(x, int | float) and math.isfinite(x) and x >= 0


def check_task(task: TaskSpec, cluster: ClusterView) -> float:
    """Validate one task against the catalogue; return its model size in MB (0 = none)."""
    if not is_finite_nonneg(task.exec_ms):
        raise PlanningError(f"task {task.name!r} has invalid exec_ms {task.exec_ms!r}")
    if not is_finite_nonneg(task.output_kb):
        raise PlanningError(f"task {task.name!r} has invalid output_kb {task.output_kb!r}")
    if task.model is None:
        return 0.0
    if task.model not in cluster.model_sizes_mb:
        raise PlanningError(
            f"task {task.name!r} needs model {task.model!r}, which is not in the model catalogue"
        )
    size = cluster.model_sizes_mb[task.model]
    if not is_finite_nonneg(size):
        raise PlanningError(f"model {task.model!r} has invalid size {size!r} MB")
    return float(size)


def check_inputs(dag: DagSpec, cluster: ClusterView) -> dict[str, float]:
    """Validate the whole DAG and cluster up front; return model size per task."""
    if not cluster.workers:
        raise PlanningError(f"no live workers to plan DAG {dag.name!r} on")
    return {name: check_task(task, cluster) for name, task in dag.nodes.items()}


def candidates(arrays: WorkerArrays, task: TaskSpec, size_mb: float) -> np.ndarray:
    """Bool mask of workers whose GPU is large enough for the model; raises if none."""
    mask = arrays.fits(size_mb)
    if not arrays.fits_any(size_mb):
        largest = float(arrays.gpu_total_mb.max()) if len(arrays) else 0.0
        raise PlanningError(
            f"no worker can hold model {task.model!r} ({size_mb:g} MB) for task "
            f"{task.name!r}; the largest GPU has {largest:g} MB"
        )
    return mask


def choose(finish: np.ndarray, backlog: np.ndarray, mask: np.ndarray | None) -> int:
    """Index minimising (finish, backlog, index) over the masked workers (None = all)."""
    f = finish if mask is None else np.where(mask, finish, math.inf)
    i = int(f.argmin())
    best = f[i]
    if not best < math.inf:  # every candidate infinite or NaN: any masked worker will do
        f = np.zeros(len(f)) if mask is None else np.where(mask, 0.0, math.inf)
        i, best = int(f.argmin()), 0.0
    ties = f == best
    if np.count_nonzero(ties) == 1:
        return i
    tied = ties.nonzero()[0]
    return int(tied[int(np.argmin(backlog[tied]))])  # argmin keeps the lowest index


def first_fit(order: list[int], mask: np.ndarray) -> int:
    """The first worker in ``order`` that the mask admits (baselines' rings and cycles)."""
    for i in order:
        if mask[i]:
            return i
    raise PlanningError("no candidate worker")  # unreachable: candidates() raised first
