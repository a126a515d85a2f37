"""Shared walk for the baselines: they pick a worker by their own rule, and their
placements carry the full cost model's estimate of what will then happen."""

from __future__ import annotations

from collections.abc import Callable

from .types import ClusterView, DagSpec, Placement, Plan
from .walk import Estimate, Walk

# (walk, task name, full-model estimate) -> (worker index, reason)
Pick = Callable[[Walk, str, Estimate], tuple[int, str]]


def plan_in_order(policy: str, dag: DagSpec, cluster: ClusterView, pick: Pick) -> Plan:
    """Place tasks in topological order with ``pick``; estimates from the full model."""
    walk = Walk(dag, cluster)
    out: dict[str, Placement] = {}
    for name in walk.topo:
        est = walk.estimate(name)
        i, reason = pick(walk, name, est)
        out[name] = walk.commit(name, i, est, reason)
    return Plan(policy, {n: out[n] for n in dag.nodes})
