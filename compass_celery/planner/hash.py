"""Model affinity by consistent hashing: a model always goes to the same worker.

Each worker owns ``vnodes`` points on a hash ring (blake2b, so the ring is the same in
every process, unlike Python's salted ``hash``); a model maps to the first point
clockwise from its own hash whose worker can hold it. A worker joining or leaving
moves only the models whose arc it takes or gives up.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .baseline import plan_in_order
from .types import ClusterView, DagSpec, Plan
from .walk import Estimate, Walk

DEFAULT_VNODES = 64


def ring_hash(key: str) -> int:
    """A 64-bit, process-independent hash of a string."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=16)
def build_ring(names: tuple[str, ...], vnodes: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(sorted point hashes, owning worker index per point) for a set of worker names."""
    points = sorted(
        (ring_hash(f"{name}#{v}"), name, i) for i, name in enumerate(names) for v in range(vnodes)
    )
    return tuple(p[0] for p in points), tuple(p[2] for p in points)


def ring_lookup(
    names: tuple[str, ...],
    key: str,
    admit: Sequence[bool] | np.ndarray | None = None,
    vnodes: int = DEFAULT_VNODES,
) -> int:
    """Index of the worker owning ``key``; ``admit`` (a bool sequence) skips workers."""
    hashes, owners = build_ring(names, vnodes)
    start = bisect.bisect(hashes, ring_hash(key))
    n = len(owners)
    for k in range(n):
        i = owners[(start + k) % n]
        if admit is None or admit[i]:
            return i
    raise ValueError("no admissible worker on the ring")


class HashPolicy:
    """Model affinity: consistent hashing sends a model's tasks to the same worker."""

    name = "hash"
    adjusts = False
    shared = False

    def __init__(self, vnodes: int = DEFAULT_VNODES) -> None:
        self.vnodes = vnodes

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Each task on the ring owner of its model (or its name) among workers that fit."""
        def pick(walk: Walk, name: str, est: Estimate) -> tuple[int, str]:
            key = walk.dag.nodes[name].model or name
            i = ring_lookup(walk.arr.names, key, est.mask, self.vnodes)
            return i, f"hash ring owner of {key!r}"

        return plan_in_order(self.name, dag, cluster, pick)
