"""The Compass policy: critical path first, each task where it is expected to finish earliest.

Finish counts all three ways latency is lost: waiting for a busy worker (its backlog,
plus work planned onto it but not yet sent), loading a model that is not resident
(doubled when something must be evicted first) and pulling inputs from another worker.
When the snapshot carries recent demand, the choice also counts what a load would evict:
the expected reloads of models pushed below their replica target (``planner.evict``).
"""

from __future__ import annotations

import numpy as np

from .choose import choose
from .evict import EvictionPricer
from .types import ClusterView, DagSpec, Placement, Plan
from .walk import Estimate, Walk

# Collocating a task with a predecessor keeps that output in the worker's memory (and the
# transfer estimate is the least reliable term); accept up to this many ms of finish for it.
DEFAULT_COLLOCATE_SLACK_MS = 2.0


class CompassPolicy:
    """``collocate_slack_ms=None`` turns the collocation preference off."""

    name = "compass"
    adjusts = True
    shared = False

    def __init__(
        self,
        count_pending: bool = True,
        collocate_slack_ms: float | None = DEFAULT_COLLOCATE_SLACK_MS,
    ) -> None:
        self.count_pending = count_pending
        self.collocate_slack_ms = collocate_slack_ms

    def plan(self, dag: DagSpec, cluster: ClusterView) -> Plan:
        """Rank order (critical path first); each task on its earliest-finish worker."""
        walk = Walk(dag, cluster, count_pending=self.count_pending)
        pricer = EvictionPricer(walk.arr, cluster.demand, cluster.model_sizes_mb) \
            if cluster.demand else None
        out: dict[str, Placement] = {}
        for name in walk.rank_order():
            est = walk.estimate(name)
            model = dag.nodes[name].model
            score, evict = est.finish, None
            if pricer is not None and model is not None:
                evict = pricer.price(model, walk.sizes[name], walk.free, est.load)
                score = est.finish + evict
            i = choose(score, walk.avail, est.restrict)
            reason = _reason(walk, name, est, i, evict)
            j = self._collocate(walk, name, est, score, i)
            if j is not None:
                extra = float(score[j] - score[i])
                reason = f"collocated with predecessor on {walk.arr.names[j]} (+{extra:.0f}ms)"
                i = j
            out[name] = walk.commit(name, i, est, reason)
            if pricer is not None and model is not None:
                pricer.mark(i, model)
        return Plan(self.name, {n: out[n] for n in dag.nodes})

    def _collocate(self, walk: Walk, name: str, est: Estimate, fin: np.ndarray,
                   best: int) -> int | None:
        """The worker of a predecessor with output to hand over, if its score (finish, plus
        any eviction price) is within the slack of the best (no output, nothing gained)."""
        if self.collocate_slack_ms is None:
            return None
        limit = float(fin[best]) + self.collocate_slack_ms
        pick: tuple[float, float, int] | None = None
        for p in walk.preds[name]:
            h = walk.worker[p]
            if h == best or not walk.dag.nodes[p].output_kb or not est.mask[h]:
                continue
            key = (float(fin[h]), float(walk.avail[h]), h)
            if key[0] <= limit and (pick is None or key < pick):
                pick = key
        return None if pick is None else pick[2]


def _reason(walk: Walk, name: str, est: Estimate, i: int, evict: np.ndarray | None) -> str:
    model = walk.dag.nodes[name].model
    if model is not None and est.load[i] == 0.0:
        return f"model resident, backlog {float(walk.avail[i]):.0f}ms"
    text = f"least finish {float(est.finish[i]):.0f}ms"
    if model is None:
        return text + " (no model)"
    if evict is not None and evict[i] > 0:
        load, cost = float(est.load[i]), float(evict[i])
        return text + f" (load {load:.0f}ms, evicts {cost:.0f}ms of likely reloads)"
    return text + f" (load {float(est.load[i]):.0f}ms)"
