"""HEFT: earliest finish by upward rank, blind to model loading, GPU cache and transfer.

The classic list scheduler: it does track each worker's availability within the plan,
so its estimates are what HEFT believes, not what the full cost model predicts.
"""

from __future__ import annotations

from .choose import choose
from .types import ClusterView, DagSpec, Placement, Plan
from .walk import Walk


class HeftPolicy:
    """Worker availability starts at the published backlog (pending work not counted)."""

    name = "heft"
    adjusts = False
    shared = False

    def __init__(self, count_pending: bool = False) -> None:
        self.count_pending = count_pending

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Rank order; each task on its earliest finish, counting queue and run only."""
        walk = Walk(
            dag, cluster, count_pending=self.count_pending, use_load=False, use_transfer=False
        )
        out: dict[str, Placement] = {}
        for name in walk.rank_order(with_transfer=False):
            est = walk.estimate(name)
            i = choose(est.finish, walk.avail, est.restrict)
            reason = f"earliest finish {float(est.finish[i]):.0f}ms (no load/transfer terms)"
            out[name] = walk.commit(name, i, est, reason)
        return Plan(self.name, {n: out[n] for n in dag.nodes})
