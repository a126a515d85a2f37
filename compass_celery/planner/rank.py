"""Upward rank (HEFT): a task's cost plus the costliest path from it to a sink.

Planning tasks in decreasing rank puts the critical path first; since costs are never
negative a predecessor ranks at least as high as its successors, and ties fall back to
topological position, so the order is always a valid topological order.
"""

from __future__ import annotations

import numpy as np

from .cost import WorkerArrays
from .types import DagSpec


def upward_rank(
    dag: DagSpec, arrays: WorkerArrays, *, with_transfer: bool = True
) -> dict[str, float]:
    """rank(t) = mean run(t) + max over successors s of (mean transfer(t->s) + rank(s)), in ms."""
    inv_speed = float(np.mean(1.0 / arrays.speed))
    ms_per_kb = float(np.mean(1.0 / arrays.net_mb_per_s)) if with_transfer else 0.0
    succs: dict[str, list[str]] = {n: [] for n in dag.nodes}
    for a, b in dag.edges:
        succs[a].append(b)
    rank: dict[str, float] = {}
    for n in reversed(dag.topological_order()):
        task = dag.nodes[n]
        own = task.exec_ms * inv_speed
        if succs[n]:
            own += task.output_kb * ms_per_kb + max(rank[s] for s in succs[n])
        rank[n] = own
    return rank


def rank_order(dag: DagSpec, arrays: WorkerArrays, *, with_transfer: bool = True) -> list[str]:
    """Tasks by decreasing upward rank, ties by topological position."""
    topo = {n: i for i, n in enumerate(dag.topological_order())}
    rank = upward_rank(dag, arrays, with_transfer=with_transfer)
    return sorted(dag.nodes, key=lambda n: (-rank[n], topo[n]))
