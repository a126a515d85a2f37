"""The policy interface every placement policy implements (pure, no I/O)."""

from __future__ import annotations

from typing import Protocol

from .types import ClusterView, DagSpec, Plan


class Policy(Protocol):
    """Turns a DAG and a cluster snapshot into a placement for every node.

    Times in the returned plan are relative to the snapshot (0 = now).
    Policies may keep state between calls (round-robin's counter, random's
    seeded generator); they never do I/O.
    """

    name: str
    #: Re-places a successor on completion against fresh state (the adjustment phase).
    adjusts: bool
    #: Places nothing: every task goes to the one shared queue (plain Celery).
    shared: bool

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """A placement for every node of ``dag`` on ``cluster``'s live workers."""
