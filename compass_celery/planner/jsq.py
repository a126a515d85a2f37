"""Join the shortest queue: each task goes to the candidate with the least backlog.

Backlog is the published one plus the run time of tasks this plan already put there,
so a DAG's tasks spread instead of all landing on the same idle worker.
"""

from __future__ import annotations

import numpy as np

from .baseline import plan_in_order
from .choose import choose
from .types import ClusterView, DagSpec, Plan
from .walk import Estimate, Walk


class JsqPolicy:
    """Join the shortest queue: the least backlog (plus this plan's own tasks), nothing else."""

    name = "jsq"
    adjusts = False
    shared = False

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Each task on the shortest queue among workers that can hold its model."""
        queued: np.ndarray | None = None

        def pick(walk: Walk, name: str, est: Estimate) -> tuple[int, str]:
            nonlocal queued
            if queued is None:
                queued = walk.arr.backlog_ms.copy()
            q = queued
            i = choose(q, q, est.mask)
            reason = f"shortest backlog {float(q[i]):.0f}ms"
            q[i] += est.run[i]
            return i, reason

        return plan_in_order(self.name, dag, cluster, pick)
