"""Evaluate a given assignment under the full cost model (wait, load, transfer, run).

Used to compare policies fairly: each policy's plan reports its own beliefs (HEFT
ignores loads), while :func:`evaluate` says what the full model expects to happen if
every task runs where the plan put it. Tasks sharing a worker run in order of their
planned (start, finish), ties by topological position, and never before their inputs;
for a plan that respects precedence this replays the policy's own placement order.
"""

from __future__ import annotations

import heapq

from .types import ClusterView, DagSpec, Placement, Plan, PlanningError
from .walk import Walk


def evaluate(plan: Plan, dag: DagSpec, cluster: ClusterView, *, count_pending: bool = True) -> Plan:
    """A plan with the same workers and the full model's start/finish for each task."""
    walk = Walk(dag, cluster, count_pending=count_pending)
    # ties on (start, finish) in the order compass commits tasks (rank, then topological):
    # a task that starts when its predecessor's output lands is committed before an
    # unrelated zero-length one that the plan put after it
    topo = {n: k for k, n in enumerate(walk.rank_order())}
    for name in dag.nodes:
        if name not in plan.placements:
            raise PlanningError(f"plan {plan.policy!r} has no placement for task {name!r}")
        worker = plan.placements[name].worker
        if worker not in walk.arr.index:
            raise PlanningError(f"plan puts task {name!r} on unknown worker {worker!r}")
    waiting = {n: len(walk.preds[n]) for n in dag.nodes}

    heap = [(_when(plan, n), topo[n], n) for n, k in waiting.items() if k == 0]
    heapq.heapify(heap)
    out: dict[str, Placement] = {}
    while heap:
        _, _, name = heapq.heappop(heap)
        est = walk.estimate(name)
        i = walk.arr.index[plan.placements[name].worker]
        if not est.mask[i]:
            raise PlanningError(f"worker {walk.arr.names[i]!r} cannot hold the model of {name!r}")
        out[name] = walk.commit(name, i, est, "evaluated under the full cost model")
        for s in walk.succs[name]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (_when(plan, s), topo[s], s))
    return Plan(plan.policy, {n: out[n] for n in dag.nodes})


def _when(plan: Plan, task: str) -> tuple[float, float]:
    """Order on a worker: a zero-length task that starts with another ran before it."""
    p = plan.placements[task]
    return (p.start_ms, p.finish_ms)
