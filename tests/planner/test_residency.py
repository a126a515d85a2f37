"""Residency for the classes with a deadline: batch loads keep off the copies live
deadline-bound demand needs; a missing model is loaded late on a busy worker; a model
one worker cannot carry within a job's budget gets a second copy."""

from __future__ import annotations

from compass_celery.planner import ClusterView, CompassPolicy, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.admission import Slo, job_missing, judge, plan_budget_ms
from compass_celery.planner.compass import plan_job
from compass_celery.planner.demand import DemandSum, DemandTracker, coarse_rates, merge_demand
from compass_celery.planner.evict import eviction_rank
from compass_celery.planner.types import ModelDemand
from compass_celery.state.records import decode_record, encode_record

SIZES = {"qa": 600.0, "embed": 600.0, "new": 600.0}
LOAD_MB_PER_S = 500.0  # a 600 MB model loads in 1,200 ms


def w(name: str, resident: set[str], backlog: float = 0.0, gpu: float = 1000.0,
      served: dict[str, ModelDemand] | None = None) -> WorkerView:
    used = sum(SIZES[m] for m in resident)
    return WorkerView(name, name, gpu, gpu - used, frozenset(resident), backlog_ms=backlog,
                      load_mb_per_s=LOAD_MB_PER_S, served=served or {})


def view(*workers: WorkerView, demand: dict[str, ModelDemand] | None = None) -> ClusterView:
    return ClusterView.of(workers, SIZES, demand=demand)


def one(model: str, exec_ms: float = 100.0) -> DagSpec:
    return DagSpec.single(TaskSpec("t", model, exec_ms))


#: qa is asked for once a second, by jobs with a deadline; embed by batch jobs only.
URGENT = {"qa": ModelDemand(100.0, 1.0, 1.0), "embed": ModelDemand(100.0, 1.0)}
BATCH_ONLY = {"qa": ModelDemand(100.0, 1.0), "embed": ModelDemand(100.0, 1.0)}
TRICKLE = {"qa": ModelDemand(100.0, 1.0, 1.0)}


def test_a_batch_load_does_not_evict_a_model_live_deadline_demand_needs() -> None:
    # "a" holds the only copy of qa and is idle; "b" holds embed and is a little busy.
    # A batch task needing "new" must evict either; qa's live urgent demand keeps it.
    cluster = view(w("a", {"qa"}), w("b", {"embed"}, backlog=300.0), demand=URGENT)
    plan = CompassPolicy().plan(one("new"), cluster)
    assert plan.worker_of("t") == "b"
    # the same demand from batch jobs only protects nothing: the idle worker wins
    plain = view(w("a", {"qa"}), w("b", {"embed"}, backlog=300.0), demand=BATCH_ONLY)
    assert CompassPolicy().plan(one("new"), plain).worker_of("t") == "a"
    # a plan with a deadline of its own is not a batch load: it may take qa's room
    assert CompassPolicy().plan(one("new"), cluster, budget_ms=5000.0).worker_of("t") == "a"


def test_the_caches_eviction_order_puts_protected_copies_last() -> None:
    cluster = view(w("a", {"qa", "embed"}, gpu=2000.0), demand=URGENT)
    rank = eviction_rank(cluster)
    assert rank["qa"] > rank["embed"]
    assert rank["qa"][0] == 2.0  # kept, and protected


def test_a_model_one_worker_cannot_carry_within_the_budget_gets_a_second_copy() -> None:
    # "a" holds qa behind 800 ms of work (ends at 900); "b" is idle without it (a
    # 1,200 ms load: ends at 1,300, later than "a"). Earliest finish alone keeps every
    # job on "a"; within an 850 ms budget "a" cannot carry it, so "b" loads a copy.
    cluster = view(w("a", {"qa"}, backlog=800.0), w("b", set()))
    plan = CompassPolicy().plan(one("qa"), cluster, budget_ms=850.0)
    p = plan.placements["t"]
    assert p.worker == "b" and p.load_ms == 1200.0 and "copy of qa" in p.reason
    # no budget (a batch plan), or a budget the holder meets: the warm worker
    assert CompassPolicy().plan(one("qa"), cluster).worker_of("t") == "a"
    assert CompassPolicy().plan(one("qa"), cluster, budget_ms=1000.0).worker_of("t") == "a"
    # a worker as busy as the holder is no help: the plan stays on the copy it has
    busy = view(w("a", {"qa"}, backlog=800.0), w("b", set(), backlog=800.0))
    assert CompassPolicy().plan(one("qa"), busy, budget_ms=850.0).worker_of("t") == "a"


def test_the_copy_rule_counts_the_critical_path_after_the_task() -> None:
    dag = DagSpec({"first": TaskSpec("first", "qa", 100.0),
                   "then": TaskSpec("then", None, 400.0)}, (("first", "then"),))
    cluster = view(w("a", {"qa"}, backlog=300.0), w("b", set()))
    # "first" ends at 400 ms on "a", within 700; with the 400 ms after it, the job not
    assert plan_job(CompassPolicy(), dag, cluster, 1000.0).worker_of("first") == "a"
    assert plan_job(CompassPolicy(), dag, cluster, 700.0).worker_of("first") == "b"


def test_a_missing_model_is_loaded_late_on_a_busy_worker_a_resident_one_is_not() -> None:
    slo = Slo("interactive", 1500.0)
    # 600 ms of in-flight work ahead, a 1,200 ms load, a 300 ms run: misses by the load
    missing = judge(slo, 2100.0, 600.0, load_ms=1200.0, missing=True)
    assert missing.admitted and missing.late and missing.kind == "cold"
    held = judge(slo, 2100.0, 600.0, load_ms=1200.0)
    assert not held.admitted and held.kind == "deadline"
    # on an idle worker the load is taken late either way; short of capacity, refused
    assert judge(slo, 1500.0 + 1200.0, 0.0, load_ms=1200.0).late
    assert not judge(slo, 3000.0, 600.0, load_ms=1200.0, missing=True).admitted


def test_job_missing_knows_held_and_loading_models() -> None:
    cluster = view(w("a", {"qa"}), w("b", set()))
    plan = CompassPolicy().plan(one("new"), cluster)
    assert job_missing(plan.placements, {"t": "new"}, cluster)
    loading = view(w("a", {"qa"}), WorkerView("b", "b", 1000.0, 400.0,
                                               loading={"new": (0.0, 1.0)}))
    assert not job_missing(plan.placements, {"t": "new"}, loading)
    assert not job_missing(CompassPolicy().plan(one("qa"), cluster).placements,
                           {"t": "qa"}, cluster)
    # a copy its demand wants (two workers' worth: a target of 3) is a missing one too
    copy = CompassPolicy().plan(one("qa"), view(w("a", {"qa"}, backlog=800.0), w("b", set())),
                                budget_ms=850.0).placements
    hot = view(w("a", {"qa"}, backlog=800.0), w("b", set()),
               demand={"qa": ModelDemand(2000.0, 20.0, 20.0)})
    assert copy["t"].worker == "b" and job_missing(copy, {"t": "qa"}, hot)
    assert not job_missing(copy, {"t": "qa"}, view(w("a", {"qa"}), w("b", set()),
                                                   demand=TRICKLE))


def test_the_budget_is_what_admission_takes_on_time() -> None:
    slo = Slo("interactive", 1000.0)
    assert plan_budget_ms(slo, 0.1, 50.0) == 850.0
    assert plan_budget_ms(slo, 0.1, 5000.0) == 400.0  # the learned error capped at half
    assert plan_budget_ms(Slo("batch"), 0.1) is None and plan_budget_ms(None) is None


def test_urgent_demand_is_tracked_published_and_summed() -> None:
    t = DemandTracker(min_age_s=0.0)
    dag = one("qa")
    for k in range(20):
        t.observe(dag, k * 0.5, urgent=k % 2 == 0)  # half of the jobs had a deadline
    r = t.rates(10.0)["qa"]
    assert abs(r.urgent_per_s / r.per_s - 0.5) < 0.05
    coarse = coarse_rates({"qa": r})["qa"]
    assert coarse.urgent_per_s > 0
    total = DemandSum([w("a", set(), served={"qa": ModelDemand(10.0, 1.0, 0.4)}),
                       w("b", set(), served={"qa": ModelDemand(10.0, 1.0, 0.2)})]).demand
    assert abs(total["qa"].urgent_per_s - 0.6) < 1e-9


def test_a_worker_record_carries_the_urgent_part_of_what_it_served() -> None:
    view_ = w("a", set(), served={"qa": ModelDemand(10.0, 1.0, 0.4),
                                  "embed": ModelDemand(5.0, 0.5)})
    back = decode_record(encode_record(view_))
    assert back.served == view_.served
    assert "served_urgent" not in encode_record(w("b", set(), served=BATCH_ONLY))


def test_once_demand_is_known_a_copy_needs_a_replica_target_above_the_copies() -> None:
    # qa is resident on "a" only. Demand of one worker's worth wants 2 copies (a target
    # at 80% busy); a trickle wants the one it has, and gets no copy however late "a" is.
    hot = {"qa": ModelDemand(1000.0, 10.0, 10.0)}
    trickle = {"qa": ModelDemand(100.0, 1.0, 1.0)}
    for demand, where in ((hot, "b"), (trickle, "a")):
        cluster = view(w("a", {"qa"}, backlog=800.0), w("b", set()), demand=demand)
        assert CompassPolicy().plan(one("qa"), cluster, budget_ms=850.0).worker_of("t") \
            == where


def test_refused_demand_adds_to_what_the_workers_served() -> None:
    served = {"qa": ModelDemand(400.0, 4.0), "embed": ModelDemand(10.0, 1.0)}
    refused = {"qa": ModelDemand(600.0, 6.0, 6.0), "new": ModelDemand(5.0, 1.0, 1.0)}
    total = merge_demand(served, refused)
    assert total["qa"] == ModelDemand(1000.0, 10.0, 6.0)
    assert total["embed"] == served["embed"] and total["new"] == refused["new"]
    assert merge_demand(served, {}) is served


def test_a_copy_takes_only_room_nothing_needs() -> None:
    # "b" is idle but full: with embed, which nobody asks for, a copy of qa may replace
    # it; with embed in demand (a kept copy), it may not, and qa stays on its one worker.
    full = w("b", {"embed"}, gpu=700.0)
    unwanted = view(w("a", {"qa"}, backlog=800.0), full,
                    demand={"qa": ModelDemand(1000.0, 10.0, 10.0)})
    assert CompassPolicy().plan(one("qa"), unwanted, budget_ms=850.0).worker_of("t") == "b"
    wanted = view(w("a", {"qa"}, backlog=800.0), full,
                  demand={"qa": ModelDemand(1000.0, 10.0, 10.0), "embed": URGENT["embed"]})
    assert CompassPolicy().plan(one("qa"), wanted, budget_ms=850.0).worker_of("t") == "a"
    # before any demand is known, only free memory: no copy onto the full worker
    young = view(w("a", {"qa"}, backlog=800.0), full)
    assert CompassPolicy().plan(one("qa"), young, budget_ms=850.0).worker_of("t") == "a"
