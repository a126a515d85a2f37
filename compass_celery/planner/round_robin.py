"""Round-robin: the next worker in name order that can hold the model.

The position is kept across calls, so consecutive single-task plans cycle.
"""

from __future__ import annotations

import numpy as np

from .baseline import plan_in_order
from .types import ClusterView, DagSpec, Plan
from .walk import Estimate, Walk


class RoundRobinPolicy:
    """Workers in turn, skipping those whose GPU cannot hold the model."""

    name = "round-robin"
    adjusts = False
    shared = False

    def __init__(self) -> None:
        self._next = 0

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Each task on the next worker in turn that can hold its model."""
        def pick(walk: Walk, name: str, est: Estimate) -> tuple[int, str]:
            cands = np.flatnonzero(est.mask)
            k = int(np.searchsorted(cands, self._next % len(walk.arr)))
            i = int(cands[k]) if k < len(cands) else int(cands[0])
            self._next = i + 1
            return i, f"round-robin turn of {walk.arr.names[i]}"

        return plan_in_order(self.name, dag, cluster, pick)
