"""The Compass policy: critical path first, each task where it is expected to finish earliest.

Finish counts all three ways latency is lost: waiting for a busy worker (its backlog,
plus work planned onto it but not yet sent), loading a model that is not resident
(doubled when something must be evicted first) and pulling inputs from another worker.
When the snapshot carries recent demand, the choice also counts what a load would evict:
the expected reloads of models pushed below their replica target (``planner.evict``),
and a load on a busy worker once more, as the time it takes from the tasks queued
behind it (``evict.busy_load_price``: past capacity, loads chased queue imbalances).

A plan given a ``budget_ms`` (its job's deadline, less admission's reserve) also makes
copies: when a task's model is resident only where the job would finish past its
budget, and a worker without it would meet the budget but for the load, the task goes
there and the model is loaded (a second copy, placed where it would serve soonest,
although the load takes seconds; admission takes a job late that misses only by its
loads). A copy takes only room nothing needs (free memory; once demand is known, also
spare copies and unwanted models), and once demand is known, only a model with fewer
copies than its replica target gets one (demand counts refusals: what one worker could
not carry). Without a budget the plan is a batch plan: its loads do not evict the
copies live deadline-bound demand keeps (``planner.evict``).
"""

from __future__ import annotations

import numpy as np

from .base import Policy
from .choose import choose
from .evict import EvictionPricer, busy_load_price
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
    #: ``plan`` takes a deadline budget (``plan_job``)
    budgets = True

    def __init__(
        self,
        count_pending: bool = True,
        collocate_slack_ms: float | None = DEFAULT_COLLOCATE_SLACK_MS,
    ) -> None:
        self.count_pending = count_pending
        self.collocate_slack_ms = collocate_slack_ms

    def plan(self, dag: DagSpec, cluster: ClusterView, budget_ms: float | None = None
             ) -> Plan:
        """Rank order (critical path first); each task on its earliest-finish worker, or
        on a new copy of its model when ``budget_ms`` (ms from now the job should end
        within) is missed where the model is resident (:func:`copy_worker`)."""
        walk = Walk(dag, cluster, count_pending=self.count_pending)
        pricer = EvictionPricer(walk.arr, cluster.demand, cluster.model_sizes_mb,
                                batch=budget_ms is None) if cluster.demand else None
        tails = _tails(walk) if budget_ms is not None else None
        out: dict[str, Placement] = {}
        for name in walk.rank_order():
            est = walk.estimate(name)
            model = dag.nodes[name].model
            score, evict = est.finish, None
            if pricer is not None and model is not None:
                if tails is None:  # priced where the choice or a collocation can fall
                    near = self._near(walk, name)
                    busy, price = pricer.prices(model, walk.sizes[name], walk.free,
                                                est.load, est.hidden, walk.avail,
                                                est.finish, est.restrict, near)
                    evict = busy + price
                else:  # a copy is chosen by score among the cold workers: price them all
                    busy = busy_load_price(est.load, est.hidden, walk.avail)
                    evict = busy + pricer.price(model, walk.sizes[name], walk.free, est.load)
                score = est.finish + evict
            i = choose(score, walk.avail, est.restrict)
            copy = None
            if tails is not None and budget_ms is not None and model is not None \
                    and (pricer is None or pricer.wants_copy(model)):
                spared = walk.free >= walk.sizes[name] if pricer is None else \
                    ~pricer.evicts_kept(model, walk.sizes[name], walk.free, est.load)
                copy = copy_worker(est, score, walk.avail, i, tails[name], budget_ms,
                                   spared)
            reason = _reason(walk, name, est, i, evict)
            if copy is not None:
                i = copy
                reason = (f"a copy of {model}: the job misses its budget where it is "
                          f"resident; load {float(est.load[i]):.0f}ms here")
            j = self._collocate(walk, name, est, score, i)
            if j is not None:
                extra = float(score[j] - score[i])
                reason = f"collocated with predecessor on {walk.arr.names[j]} (+{extra:.0f}ms)"
                i = j
            out[name] = walk.commit(name, i, est, reason)
            if pricer is not None and model is not None:
                pricer.mark(i, model)
        return Plan(self.name, {n: out[n] for n in dag.nodes})

    def _near(self, walk: Walk, name: str) -> list[int]:
        """The workers :meth:`_collocate` reads the score of: predecessors' with output."""
        if self.collocate_slack_ms is None:
            return []
        return [walk.worker[p] for p in walk.preds[name] if walk.dag.nodes[p].output_kb]

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


def copy_worker(est: Estimate, score: np.ndarray, avail: np.ndarray, best: int,
                tail_ms: float, budget_ms: float, spared: np.ndarray | None = None
                ) -> int | None:
    """Where to load another copy of a task's model, or None: when the best worker
    holds the model but the job would end past ``budget_ms`` there (the task's finish
    plus ``tail_ms``, the critical path after it), the worker without it that would
    serve it soonest (least score, load included), provided the job would meet the
    budget there but for the load, and (``spared``, where given) the load takes only
    room nothing needs: free memory, a spare copy or a model nobody asks for. A copy is
    extra capacity, not worth a copy another model's demand keeps: under memory
    pressure the two would evict each other in turn (navigator-mixed on 2 workers at
    160%: 4x the loads). Copies follow demand: one worker that cannot carry a class's
    demand within its deadline gets a second, though the load takes seconds."""
    if est.load[best] > 0 or est.finish[best] + tail_ms <= budget_ms:
        return None
    cold = est.mask & (est.load > 0)
    if spared is not None:
        cold &= spared
    if not cold.any():
        return None
    k = choose(score, avail, cold)
    if est.finish[k] - est.load[k] + tail_ms > budget_ms:
        return None  # as busy as the holders: a copy there would not help
    return k


def _tails(walk: Walk) -> dict[str, float]:
    """Per task, the critical path after it (ms): its upward rank less its own run."""
    rank = walk.upward_rank()  # the rank its order is made by, worked out once
    inv_speed = walk.arr.mean("speed", inverse=True)
    return {n: r - walk.dag.nodes[n].exec_ms * inv_speed for n, r in rank.items()}


def plan_job(policy: Policy, dag: DagSpec, cluster: ClusterView,
             budget_ms: float | None = None) -> Plan:
    """``policy.plan``, with the job's deadline budget for a policy that takes one
    (``budgets``: compass); the router, a Dag submission and the simulator plan so."""
    if budget_ms is not None and getattr(policy, "budgets", False):
        return policy.plan(dag, cluster, budget_ms=budget_ms)  # type: ignore[call-arg]
    return policy.plan(dag, cluster)


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
