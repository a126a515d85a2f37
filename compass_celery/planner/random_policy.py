"""Random: a uniformly random candidate, from a seeded generator (reproducible runs)."""

from __future__ import annotations

import random

import numpy as np

from .baseline import plan_in_order
from .types import ClusterView, DagSpec, Plan
from .walk import Estimate, Walk


class RandomPolicy:
    """A uniformly random worker that fits, seeded so runs repeat."""

    name = "random"
    adjusts = False
    shared = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Each task on a seeded random worker that can hold its model."""
        def pick(walk: Walk, name: str, est: Estimate) -> tuple[int, str]:
            cands = np.flatnonzero(est.mask)
            i = int(cands[self._rng.randrange(len(cands))])
            return i, f"random pick of {len(cands)} candidates"

        return plan_in_order(self.name, dag, cluster, pick)
