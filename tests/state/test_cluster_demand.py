"""The cluster's demand on a real cluster, read side: the sum of what live workers served,
kept by the view cache row by row, and priced by the planner's decisions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compass_celery.needs import TaskNeeds
from compass_celery.placement import decide
from compass_celery.planner import get_policy
from compass_celery.planner.cost import evolve as fold_view
from compass_celery.planner.demand import (
    MIN_RATE_PER_S,
    DemandSum,
    cluster_demand,
    coarse_rates,
)
from compass_celery.planner.types import ModelDemand, WorkerView
from compass_celery.state.store import Snapshot
from compass_celery.state.views import ViewCache, cluster_view

SIZES = {"busy": 900.0, "other": 900.0, "c": 300.0}


def worker(name: str, served: dict[str, ModelDemand] | None = None, **kw: object) -> WorkerView:
    base: dict = {"gpu_total_mb": 1000.0, "gpu_free_mb": 1000.0}
    base.update(kw)
    return WorkerView(name=name, queue=f"q.{name}", served=served or {}, **base)


def approx_demand(d: dict[str, ModelDemand]) -> dict[str, object]:
    """Compares equal to a demand whose rates match ``d``'s up to float rounding."""
    return {m: pytest.approx((v.ms_per_s, v.per_s)) for m, v in d.items()}


def pairs(d: dict[str, ModelDemand]) -> dict[str, tuple[float, float]]:
    return {m: (v.ms_per_s, v.per_s) for m, v in d.items()}


def test_cluster_demand_sums_the_workers_served_rates() -> None:
    ws = [worker("a", {"busy": ModelDemand(600.0, 1.5), "c": ModelDemand(10.0, 0.1)}),
          worker("b", {"busy": ModelDemand(300.0, 0.5)}), worker("idle")]
    assert cluster_demand(ws) == {"busy": ModelDemand(900.0, 2.0), "c": ModelDemand(10.0, 0.1)}
    assert cluster_demand([]) == {} and cluster_demand([worker("idle")]) == {}
    assert DemandSum(ws).demand == cluster_demand(ws)


def test_demand_sum_swaps_rows_and_forgets_models_nobody_serves() -> None:
    a = worker("a", {"busy": ModelDemand(600.0, 1.5)})
    b = worker("b", {"busy": ModelDemand(0.1, 0.3), "c": ModelDemand(10.0, 0.1)})
    sums = DemandSum([a, b])
    before = sums.demand
    assert not sums.replace(a, fold_view(a, backlog_ms=5.0))  # a charge: served unchanged
    assert sums.demand is before
    b2 = replace(b, served={"busy": ModelDemand(0.2, 0.3)})
    assert sums.replace(b, b2)
    assert pairs(sums.demand) == approx_demand(cluster_demand([a, b2])) and "c" not in sums.demand
    copy = sums.copy()
    copy.replace(a, replace(a, served={}))
    assert "busy" in sums.demand and pairs(copy.demand) == approx_demand(cluster_demand([b2]))


def test_published_rates_are_coarse() -> None:
    got = coarse_rates({"x": ModelDemand(1234.5, 0.5678), "gone": ModelDemand(1.0, 1e-4)})
    assert got == {"x": ModelDemand(1200.0, 0.57)}
    assert coarse_rates({"m": ModelDemand(5.0, MIN_RATE_PER_S)}) == {
        "m": ModelDemand(5.0, MIN_RATE_PER_S)}


def test_view_cache_carries_the_demand_and_rebuilds_it_only_for_changed_rows() -> None:
    cache = ViewCache()
    ws = tuple(worker(f"w{i:02d}", {"busy": ModelDemand(100.0 * i, 0.1 * i)} if i % 3 else {},
                      resident=frozenset({"busy"}) if i % 3 else frozenset())
               for i in range(30))
    first = cache.get(ws, SIZES, 1.0)
    assert pairs(first.demand) == approx_demand(cluster_demand(ws)) and first.demand
    charged = list(ws)
    charged[4] = fold_view(ws[4], backlog_ms=100.0)
    view = cache.get(tuple(charged), SIZES, 1.0)
    assert cache.carried == 1 and view.demand is first.demand  # nothing re-summed
    changed = list(charged)
    changed[5] = replace(ws[5], served={"busy": ModelDemand(1.0, 0.01),
                                        "c": ModelDemand(50.0, 2.0)})
    changed[6] = replace(ws[6], served={})
    view = cache.get(tuple(changed), SIZES, 2.0)
    assert cache.carried == 2 and cache.built == 1
    assert pairs(view.demand) == approx_demand(cluster_demand(changed))
    assert pairs(first.demand) == approx_demand(cluster_demand(ws))  # the older view is untouched
    gone = cache.get(tuple(changed[:-1]), SIZES, 3.0)
    assert cache.built == 2 and gone.demand == cluster_demand(changed[:-1])


def test_a_decision_with_demand_keeps_the_only_copy_of_a_busy_model() -> None:
    """Worker ``fast`` holds the only copy of ``busy`` and would win ``other`` on earliest
    finish (4x speed outweighs evicting); with the demand its workers report, evicting
    the busy model's only copy is priced and the empty worker loads ``other``."""
    fast = worker("fast", resident=frozenset({"busy"}), gpu_free_mb=100.0, speed=4.0)
    empty = worker("empty")
    task = TaskNeeds("t", "other", 1000.0, 0.0, "call")
    policy = get_policy("compass")
    without = decide(task, Snapshot((empty, fast), taken_at=1.0), policy, SIZES, "shared")
    assert without.worker == "fast"
    busy = {"busy": ModelDemand(800.0, 2.0)}
    served = replace(fast, served=busy)
    with_demand = decide(task, Snapshot((empty, served), taken_at=2.0), policy, SIZES, "shared")
    assert with_demand.worker == "empty", with_demand
    assert cluster_view(Snapshot((empty, served), taken_at=2.0), SIZES).demand == busy


def test_readers_of_a_snapshot_see_the_summed_demand() -> None:
    ws = (worker("a", {"busy": ModelDemand(400.0, 1.0)}),
          worker("b", {"busy": ModelDemand(400.0, 1.0)}))
    view = cluster_view(Snapshot(ws, taken_at=5.0), SIZES)
    assert view.demand == {"busy": ModelDemand(800.0, 2.0)} and view.now == 5.0
