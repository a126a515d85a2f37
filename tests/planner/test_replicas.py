"""Demand, replica targets and eviction prices: compass keeps busy models resident."""

from __future__ import annotations

import math

import pytest

from compass_celery.cache.decisions import CacheDecider
from compass_celery.planner import ClusterView, CompassPolicy, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.adjust import reassign
from compass_celery.planner.demand import DemandTracker, replica_targets
from compass_celery.planner.evict import eviction_rank
from compass_celery.planner.types import ModelDemand

SIZES = {"hot": 500.0, "busy": 500.0, "cold": 500.0, "d": 500.0, "e": 500.0, "f": 500.0}


def w(name: str, resident: set[str], backlog: float = 0.0, gpu: float = 1000.0) -> WorkerView:
    used = sum(SIZES[m] for m in resident)
    return WorkerView(name, name, gpu, gpu - used, frozenset(resident), backlog_ms=backlog)


def demand(**ms_per_s: float) -> dict[str, ModelDemand]:
    """Every model asked for twice a second unless it has no GPU time at all."""
    return {m: ModelDemand(ms, 2.0 if ms else 0.0) for m, ms in ms_per_s.items()}


def plan_one(cluster: ClusterView, model: str, exec_ms: float = 50.0) -> str:
    dag = DagSpec.single(TaskSpec("t", model, exec_ms))
    return CompassPolicy().plan(dag, cluster).worker_of("t")


def test_tracker_estimates_a_steady_rate_and_stays_quiet_while_young() -> None:
    t = DemandTracker(tau_s=30.0, min_age_s=10.0)
    for k in range(400):  # 4 tasks per second of 250 ms: one worker's worth
        t.add("m", 250.0, k * 0.25)
    assert t.rates(99.75)["m"].ms_per_s == pytest.approx(1000.0, rel=0.05)
    assert t.rates(99.75)["m"].per_s == pytest.approx(4.0, rel=0.05)
    young = DemandTracker(min_age_s=10.0)
    young.add("m", 250.0, 0.0)
    young.add("m", 250.0, 5.0)
    assert young.rates(5.0) == {}
    # a model nobody asks for any more fades away
    assert t.rates(99.75 + 300)["m"].per_s < 4.0 * math.exp(-9)


def test_tracker_observes_every_task_of_a_job() -> None:
    t = DemandTracker(min_age_s=0.0)
    dag = DagSpec({"a": TaskSpec("a", "x", 10.0), "b": TaskSpec("b", "y", 30.0),
                   "c": TaskSpec("c", None, 5.0)}, (("a", "b"),))
    t.observe(dag, 0.0)
    t.observe(dag, 1.0)
    r = t.rates(1.0)
    assert set(r) == {"x", "y"} and r["y"].ms_per_s == pytest.approx(3 * r["x"].ms_per_s)


def test_replica_targets_cover_demand_at_the_busy_share() -> None:
    d = {"hot": ModelDemand(1600.0, 2.0), "warm": ModelDemand(300.0, 1.0),
         "idle": ModelDemand(0.0, 0.0), "wide": ModelDemand(9000.0, 9.0)}
    assert replica_targets(d, {"wide": 3}) == {"hot": 2, "warm": 1, "wide": 3}


def test_a_load_does_not_evict_below_target_when_an_equal_finish_alternative_exists() -> None:
    # "a0" and "b0" are identical for finish (idle, full, same load); a load on "a0" would
    # evict the only copy of d or f, one on "b0" a spare copy of e (also on "c0").
    workers = [w("a0", {"d", "f"}), w("b0", {"e", "cold"}), w("c0", {"e", "busy"}, 9000.0),
               w("h0", {"hot"}, 9000.0)]
    plain = ClusterView.of(workers, SIZES)
    assert plan_one(plain, "hot") == "a0"  # without demand: the tie goes to the first
    known = ClusterView.of(workers, SIZES, demand=demand(
        hot=1600.0, d=100.0, e=100.0, f=100.0, cold=100.0, busy=100.0))
    assert plan_one(known, "hot") == "b0"


def test_a_hot_model_gets_its_second_copy_where_the_eviction_is_cheap() -> None:
    # "hot" (target 2, one copy on a busy worker) must go somewhere: "a0" holds the only
    # copy of a busy model, "b0" the only copy of a model nobody has asked for lately.
    workers = [w("a0", {"busy", "d"}), w("b0", {"cold", "e"}), w("h0", {"hot", "f"}, 5000.0)]
    known = ClusterView.of(workers, SIZES, demand={
        "hot": ModelDemand(1600.0, 4.0), "busy": ModelDemand(700.0, 2.0),
        "d": ModelDemand(50.0, 2.0), "e": ModelDemand(50.0, 2.0), "f": ModelDemand(50.0, 2.0),
        "cold": ModelDemand(1.0, 0.002)})
    assert plan_one(ClusterView.of(workers, SIZES), "hot") == "a0"
    assert plan_one(known, "hot") == "b0"
    # and the same rule holds when a released successor is re-placed
    moved = reassign(TaskSpec("t", "hot", 50.0), "h0", known, {})
    assert moved is not None and moved.worker == "b0"
    reason = CompassPolicy().plan(DagSpec.single(TaskSpec("t", "hot", 50.0)),
                                  known).placements["t"].reason
    assert "evicts" in reason and "likely reloads" in reason


def test_a_resident_copy_still_wins_and_no_demand_changes_nothing() -> None:
    workers = [w("a0", {"d"}), w("b0", {"hot"}, 100.0), w("c0", {"e", "f"})]
    known = ClusterView.of(workers, SIZES, demand=demand(hot=1600.0, d=100.0, e=1.0, f=1.0))
    assert plan_one(known, "hot") == "b0"  # 100 ms of queue beats a 333 ms load
    dag = DagSpec({"a": TaskSpec("a", "d", 20.0, 10.0), "b": TaskSpec("b", "hot", 30.0)},
                  (("a", "b"),))
    plain = ClusterView.of(workers, SIZES)
    empty = ClusterView.of(workers, SIZES, demand={})
    assert CompassPolicy().plan(dag, plain) == CompassPolicy().plan(dag, empty)


def test_the_cache_evicts_in_the_planners_order() -> None:
    workers = [w("a0", {"d", "e"}), w("b0", {"e"})]
    known = ClusterView.of(workers, SIZES, demand=demand(d=100.0, e=100.0, hot=100.0))
    rank = eviction_rank(known)
    assert rank["e"] < rank["d"]  # e is spare (two copies, target one), d is kept
    assert eviction_rank(ClusterView.of(workers, SIZES)) == {}
    dec = CacheDecider(1000.0, "lookahead", sizes=SIZES)
    for m in ("e", "d"):
        dec.on_need(m, now=0.0)
        dec.on_loaded(m, now=0.0)
    dec.on_used("d", 1.0)
    dec.on_used("e", 2.0)  # LRU alone would evict d
    dec.rank = rank
    actions = dec.on_need("hot", now=3.0)
    assert [a.name for a in actions] == ["e", "hot"]


def test_snapshot_terms_are_shared_between_plans_but_never_stale() -> None:
    """The pricer's per-snapshot terms are worked out once per residency and demand; a
    plan's own loads change its copy only, and a new residency gets new terms."""
    from compass_celery.planner.cost import with_rows, worker_arrays
    from compass_celery.planner.evict import EvictionPricer

    c = ClusterView.of([w("a", {"hot"}), w("b", {"busy"}), w("c", set())], SIZES,
                       demand=demand(hot=900.0, busy=900.0))
    arrays = worker_arrays(c)
    first = EvictionPricer(arrays, c.demand, SIZES)
    second = EvictionPricer(arrays, c.demand, SIZES)
    assert first.copies is second.copies  # shared, not worked out again
    hot = arrays.models["hot"]
    first.mark(2, "hot")  # this plan loads hot on c
    assert first.copies[hot] == 2 and second.copies[hot] == 1
    assert not second.resident[2, hot] and first.resident[2, hot]
    charged = with_rows(arrays, {2: w("c", set(), backlog=50.0)}, {2: c.workers[2]})
    assert EvictionPricer(charged, c.demand, SIZES).copies is second.copies  # a charge
    loaded = with_rows(arrays, {2: w("c", {"hot"})}, {2: c.workers[2]})
    assert EvictionPricer(loaded, c.demand, SIZES).copies[hot] == 2  # a load: new terms
    assert EvictionPricer(arrays, {}, SIZES).price("cold", 500.0, arrays.gpu_free_mb,
                                                    arrays.gpu_free_mb * 0 + 1.0).sum() == 0
