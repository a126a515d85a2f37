"""Cost terms of the planner: a task's finish on a worker = wait + load + transfer + run.

Each term is a few lines with its unit stated, written once over numpy arrays (one
element per worker, built once per :class:`ClusterView` by :func:`worker_arrays`) so
that planning stays fast at 1,000 workers. :func:`scalar_costs` is the same model in
plain Python for one worker: tests hold the numpy path to it.

Units: ms, MB, MB/s; task outputs in KB (1 MB = 1000 KB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .types import ClusterView, WorkerView

KB_PER_MB = 1000.0
MS_PER_S = 1000.0
# Loading into memory that is not free means evicting first: the authors'
# implementation doubles the load time, and so do we.
EVICTION_PENALTY = 2.0


@dataclass(frozen=True, eq=False)
class WorkerArrays:
    """Per-worker columns of a snapshot, index i = ``cluster.workers[i]``."""

    names: tuple[str, ...]
    queues: tuple[str, ...]
    index: dict[str, int]
    backlog_ms: np.ndarray
    pending_ms: np.ndarray
    speed: np.ndarray
    gpu_free_mb: np.ndarray
    gpu_total_mb: np.ndarray
    load_mb_per_s: np.ndarray
    host_load_mb_per_s: np.ndarray
    net_mb_per_s: np.ndarray
    positions: np.ndarray  # 0..n-1, for "is this the worker holding the input"
    models: dict[str, int]  # model name -> column of the resident matrices
    resident: np.ndarray  # bool (workers, models): model in GPU memory
    host_resident: np.ndarray  # bool (workers, models): model in host RAM

    def __len__(self) -> int:
        return len(self.names)

    def available_ms(self, count_pending: bool) -> np.ndarray:
        """ms until each worker is free: backlog, plus planned-not-sent work if counted."""
        return self.backlog_ms + self.pending_ms if count_pending else self.backlog_ms.copy()


_FIELDS = (
    "backlog_ms",
    "pending_ms",
    "speed",
    "gpu_free_mb",
    "gpu_total_mb",
    "load_mb_per_s",
    "host_load_mb_per_s",
    "net_mb_per_s",
)


def worker_arrays(cluster: ClusterView) -> WorkerArrays:
    """Build the columns once per snapshot (one Python pass over the workers)."""
    workers = cluster.workers
    n = len(workers)
    rows = [
        (
            w.backlog_ms,
            w.pending_ms,
            w.speed,
            w.gpu_free_mb,
            w.gpu_total_mb,
            w.load_mb_per_s,
            w.host_load_mb_per_s,
            w.net_mb_per_s,
        )
        for w in workers
    ]
    table = np.array(rows, dtype=float).reshape(n, len(_FIELDS))
    models = {m: j for j, m in enumerate(cluster.model_sizes_mb)}
    resident = np.zeros((n, len(models)), dtype=bool)
    host = np.zeros((n, len(models)), dtype=bool)
    for i, w in enumerate(workers):
        for m in w.resident:
            j = models.get(m)
            if j is not None:
                resident[i, j] = True
        for m in w.host_resident:
            j = models.get(m)
            if j is not None:
                host[i, j] = True
    names = tuple(w.name for w in workers)
    cols = {f: np.ascontiguousarray(table[:, k]) for k, f in enumerate(_FIELDS)}
    return WorkerArrays(
        names=names,
        queues=tuple(w.queue for w in workers),
        index={name: i for i, name in enumerate(names)},
        positions=np.arange(n),
        models=models,
        resident=resident,
        host_resident=host,
        **cols,
    )


def queue_wait_ms(available_ms: np.ndarray, ready_ms: np.ndarray) -> np.ndarray:
    """ms between the inputs being ready and the worker being free (never negative)."""
    return np.maximum(available_ms, ready_ms) - ready_ms


def load_ms(
    size_mb: float,
    resident: np.ndarray,
    host_resident: np.ndarray,
    free_mb: np.ndarray,
    load_mb_per_s: np.ndarray,
    host_load_mb_per_s: np.ndarray,
) -> np.ndarray:
    """ms to get the model into GPU memory: 0 if resident, from host RAM if there,
    else from storage; times EVICTION_PENALTY when it does not fit in free memory."""
    base = np.where(host_resident, size_mb / host_load_mb_per_s, size_mb / load_mb_per_s)
    penalty = np.where(size_mb > free_mb, EVICTION_PENALTY, 1.0)
    return np.where(resident, 0.0, base * MS_PER_S * penalty)


def transfer_ms(kb_elsewhere: np.ndarray, net_mb_per_s: np.ndarray) -> np.ndarray:
    """ms to pull the inputs that are not already on the worker (KB over MB/s)."""
    return kb_elsewhere / KB_PER_MB / net_mb_per_s * MS_PER_S


def run_ms(exec_ms: float, speed: np.ndarray) -> np.ndarray:
    """ms of compute: the profiled run time scaled by the worker's speed factor."""
    return exec_ms / speed


def finish_ms(start_ms: np.ndarray, load: np.ndarray, run: np.ndarray) -> np.ndarray:
    """ms from now until the task is done: start (worker free, inputs in) + load + run."""
    return start_ms + load + run


class Costs(NamedTuple):
    """One worker's estimate for one task, every field in ms."""

    ready: float
    wait: float
    load: float
    transfer: float
    run: float
    start: float
    finish: float


def scalar_costs(
    exec_ms: float,
    size_mb: float,
    worker: WorkerView,
    *,
    available_ms: float,
    free_mb: float,
    resident: bool,
    host_resident: bool,
    inputs: Sequence[tuple[float, str, float]] = (),
) -> Costs:
    """Reference model for one worker; ``inputs`` = (pred finish ms, pred worker, KB)."""
    inputs_done = max((f for f, _, _ in inputs), default=0.0)
    kb = 0.0
    for _, where, out_kb in inputs:
        kb += 0.0 if where == worker.name else out_kb
    transfer = kb / KB_PER_MB / worker.net_mb_per_s * MS_PER_S
    ready = inputs_done + transfer
    if resident:
        load = 0.0
    else:
        bw = worker.host_load_mb_per_s if host_resident else worker.load_mb_per_s
        load = size_mb / bw * MS_PER_S * (EVICTION_PENALTY if size_mb > free_mb else 1.0)
    run = exec_ms / worker.speed
    start = max(available_ms, ready)
    return Costs(ready, start - ready, load, transfer, run, start, start + load + run)


def is_finite_nonneg(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x >= 0
