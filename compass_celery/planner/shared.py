"""Plain Celery: one shared queue, and whichever worker is free next takes the task.

Placements name worker ``SHARED`` (``"*"``) and queue ``SHARED`` (the router substitutes the real
shared queue's name); the estimates are computed as if the least-backlog worker that
can hold the model took it, which is what a free-worker-takes-next queue approximates.
"""

from __future__ import annotations

from dataclasses import replace

from .baseline import plan_in_order
from .choose import choose
from .types import SHARED, ClusterView, DagSpec, Plan
from .walk import Estimate, Walk

ANY = SHARED


class SharedQueuePolicy:
    """Plain Celery: one shared queue, any free worker takes the next task."""

    name = "celery-default"
    adjusts = False
    shared = True

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Every task on the shared queue; estimates as if on the least loaded worker."""
        def pick(walk: Walk, name: str, est: Estimate) -> tuple[int, str]:
            i = choose(walk.avail, walk.avail, est.mask)
            who = walk.arr.names[i]
            return i, f"shared queue; estimated as if {who} (backlog {float(walk.avail[i]):.0f}ms)"

        plan = plan_in_order(self.name, dag, cluster, pick)
        anywhere = {n: replace(p, worker=ANY, queue=ANY) for n, p in plan.placements.items()}
        return Plan(self.name, anywhere)
