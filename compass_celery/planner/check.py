"""Plan invariants, checked on every plan when ``compass_validate`` is on (as in tests).

Like dask's ``validate`` switch: costly asserts kept out of the hot path by default.
"""

from __future__ import annotations

from .types import SHARED, ClusterView, DagSpec, Plan, PlanningError

EPS_MS = 1e-6


def check_plan(plan: Plan, dag: DagSpec, cluster: ClusterView) -> None:
    """Raise PlanningError naming the first broken invariant: every node placed once, on a
    live worker whose GPU can hold its model, never starting before a predecessor ends."""
    missing = set(dag.nodes) - set(plan.placements)
    if missing:
        raise PlanningError(f"plan by {plan.policy} leaves nodes unplaced: {sorted(missing)}")
    workers = {w.name: w for w in cluster.workers}
    for name, p in plan.placements.items():
        if p.worker == SHARED:
            continue
        w = workers.get(p.worker)
        if w is None:
            raise PlanningError(f"plan by {plan.policy} puts {name!r} on unknown or dead "
                                f"worker {p.worker!r}")
        if p.queue != w.queue:
            raise PlanningError(f"plan by {plan.policy} sends {name!r} to queue {p.queue!r}, "
                                f"not {w.name}'s {w.queue!r}")
        model = dag.nodes[name].model
        size = cluster.model_sizes_mb.get(model, 0.0) if model else 0.0
        if size > w.gpu_total_mb:
            raise PlanningError(f"plan by {plan.policy} puts {name!r} (model {model!r}, "
                                f"{size:.0f} MB) on {w.name} with {w.gpu_total_mb:.0f} MB")
        if p.finish_ms + EPS_MS < p.start_ms:
            raise PlanningError(f"plan by {plan.policy}: {name!r} finishes before it starts")
    for a, b in dag.edges:
        pa, pb = plan.placements[a], plan.placements[b]
        if SHARED not in (pa.worker, pb.worker) and pb.start_ms + EPS_MS < pa.finish_ms:
            raise PlanningError(f"plan by {plan.policy}: {b!r} starts at {pb.start_ms:.1f} ms, "
                                f"before its predecessor {a!r} ends at {pa.finish_ms:.1f} ms")
