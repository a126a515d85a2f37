"""Topological order and upward rank (HEFT): a task's cost plus the costliest path to a sink.

Planning tasks in decreasing rank puts the critical path first; since costs are never
negative a predecessor ranks at least as high as its successors, and ties fall back to
topological position, so the order is always a valid topological order.
"""

from __future__ import annotations

from .cost import WorkerArrays
from .types import DagSpec


def successors(dag: DagSpec) -> dict[str, list[str]]:
    """Successor lists in edge order (one pass, unlike ``DagSpec.succs`` per node)."""
    return dag.successor_lists()


def topo_order(dag: DagSpec, succs: dict[str, list[str]]) -> list[str]:
    """``DagSpec.topological_order``: Kahn in O(V + E), ties by declaration order."""
    return dag.topological_order()


def upward_rank(
    dag: DagSpec,
    arrays: WorkerArrays,
    topo: list[str],
    succs: dict[str, list[str]],
    *,
    with_transfer: bool = True,
) -> dict[str, float]:
    """rank(t) = mean run(t) + max over successors s of (mean transfer(t->s) + rank(s)), ms."""
    inv_speed = arrays.mean("speed", inverse=True)
    ms_per_kb = arrays.mean("ms_per_kb") if with_transfer else 0.0
    rank: dict[str, float] = {}
    for n in reversed(topo):
        task = dag.nodes[n]
        own = task.exec_ms * inv_speed
        if succs[n]:
            own += task.output_kb * ms_per_kb + max(rank[s] for s in succs[n])
        rank[n] = own
    return rank


def rank_order(
    dag: DagSpec,
    arrays: WorkerArrays,
    topo: list[str],
    succs: dict[str, list[str]],
    *,
    with_transfer: bool = True,
) -> list[str]:
    """Tasks by decreasing upward rank, ties by topological position."""
    return by_rank(topo, upward_rank(dag, arrays, topo, succs, with_transfer=with_transfer))


def by_rank(topo: list[str], rank: dict[str, float]) -> list[str]:
    """``topo``'s tasks by decreasing ``rank`` (:func:`upward_rank`), ties by position."""
    pos = {n: i for i, n in enumerate(topo)}
    return sorted(topo, key=lambda n: (-rank[n], pos[n]))
