"""Unit tests per policy: where tasks land, and the errors that name what is wrong."""

from __future__ import annotations

import math

import pytest

from compass_celery.planner import (
    POLICIES,
    ClusterView,
    CompassPolicy,
    DagSpec,
    HashPolicy,
    HeftPolicy,
    JsqPolicy,
    PlanningError,
    RandomPolicy,
    RoundRobinPolicy,
    SharedQueuePolicy,
    TaskSpec,
    get_policy,
)

from .strategies import worker

MODELS = {"x": 3000.0, "y": 1500.0, "huge": 40000.0}


def one(task: TaskSpec) -> DagSpec:
    return DagSpec.single(task)


def cluster(*workers) -> ClusterView:  # type: ignore[no-untyped-def]
    return ClusterView.of(workers, MODELS)


def test_task_lands_on_the_worker_holding_its_model() -> None:
    c = cluster(worker("a"), worker("b", resident=frozenset({"x"})), worker("c"))
    p = CompassPolicy().plan(one(TaskSpec("t", "x", 50.0)), c).placements["t"]
    assert p.worker == "b" and p.queue == "q.b" and p.load_ms == 0.0
    assert p.reason.startswith("model resident")


def test_busy_holder_loses_when_backlog_outweighs_load() -> None:
    # loading x (3000 MB at 1500 MB/s) costs 2000 ms on the idle worker
    busy = worker("a", resident=frozenset({"x"}), backlog_ms=2500.0)
    c = cluster(busy, worker("b"))
    p = CompassPolicy().plan(one(TaskSpec("t", "x", 50.0)), c).placements["t"]
    assert (p.worker, p.load_ms, p.finish_ms) == ("b", 2000.0, 2050.0)
    assert "load 2000ms" in p.reason


def test_busy_holder_wins_when_backlog_is_cheaper_than_load() -> None:
    c = cluster(worker("a", resident=frozenset({"x"}), backlog_ms=1500.0), worker("b"))
    p = CompassPolicy().plan(one(TaskSpec("t", "x", 50.0)), c).placements["t"]
    assert (p.worker, p.start_ms, p.finish_ms) == ("a", 1500.0, 1550.0)


def test_eviction_doubles_load_and_host_ram_is_faster() -> None:
    c = cluster(worker("a", gpu_free_mb=1000.0), worker("b", host_resident=frozenset({"x"})))
    plan = CompassPolicy().plan(one(TaskSpec("t", "x", 0.0)), c)
    assert plan.placements["t"].worker == "b"  # 3000 MB / 12000 MB/s = 250 ms
    assert plan.placements["t"].load_ms == 250.0
    only_a = cluster(worker("a", gpu_free_mb=1000.0))
    assert CompassPolicy().plan(one(TaskSpec("t", "x", 0.0)), only_a).makespan_ms == 4000.0


def test_pending_counts_only_when_asked() -> None:
    c = cluster(worker("a", pending_ms=500.0), worker("b", backlog_ms=100.0))
    t = one(TaskSpec("t", None, 10.0))
    assert CompassPolicy().plan(t, c).worker_of("t") == "b"
    assert CompassPolicy(count_pending=False).plan(t, c).worker_of("t") == "a"


def test_later_tasks_of_a_plan_see_the_model_loaded_and_the_worker_busy() -> None:
    c = cluster(worker("a"), worker("b", backlog_ms=500.0))
    dag = DagSpec({"s": TaskSpec("s", "x", 100.0), "t": TaskSpec("t", "x", 100.0)}, ())
    plan = CompassPolicy().plan(dag, c)
    s, t = plan.placements["s"], plan.placements["t"]
    # t: b would finish at 500 + 2000 + 100; a has x loaded by s, free at 2100 -> 2200
    assert (s.worker, t.worker, t.load_ms, t.start_ms) == ("a", "a", 0.0, 2100.0)


def test_successor_collocates_within_slack_and_not_beyond() -> None:
    c = cluster(worker("a"), worker("b"))
    dag = DagSpec(
        {
            "p": TaskSpec("p", None, 10.0, output_kb=1.0),
            "q": TaskSpec("q", None, 10.0),
            "r": TaskSpec("r", None, 10.0),
        },
        (("p", "q"), ("p", "r")),
    )
    plan = CompassPolicy(collocate_slack_ms=15.0).plan(dag, c)
    assert {pl.worker for pl in plan.placements.values()} == {"a"}
    assert "collocated" in plan.placements["r"].reason
    spread = CompassPolicy(collocate_slack_ms=None).plan(dag, c)
    assert spread.worker_of("q") != spread.worker_of("r")


def test_precedence_and_transfer_in_planned_times() -> None:
    c = cluster(worker("a", net_mb_per_s=1.0), worker("b", net_mb_per_s=1.0))
    dag = DagSpec(
        {"p": TaskSpec("p", None, 10.0, output_kb=1000.0), "q": TaskSpec("q", None, 10.0)},
        (("p", "q"),),
    )
    plan = CompassPolicy(collocate_slack_ms=None).plan(dag, c)
    p, q = plan.placements["p"], plan.placements["q"]
    assert q.worker == p.worker and q.transfer_ms == 0.0 and q.start_ms == p.finish_ms


def test_model_too_large_names_model_size_and_largest_gpu() -> None:
    c = cluster(worker("a"), worker("b", gpu_total_mb=24000.0))
    for policy in POLICIES:
        with pytest.raises(PlanningError, match=r"'huge' \(40000 MB\).*largest GPU has 24000 MB"):
            get_policy(policy).plan(one(TaskSpec("t", "huge")), c)


def test_unknown_model_is_named() -> None:
    with pytest.raises(PlanningError, match="'nope'.*not in the model catalogue"):
        CompassPolicy().plan(one(TaskSpec("t", "nope")), cluster(worker("a")))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_exec_ms_names_the_task(bad: float) -> None:
    with pytest.raises(PlanningError, match="task 'broken'"):
        HeftPolicy().plan(one(TaskSpec("broken", None, bad)), cluster(worker("a")))


def test_no_workers_and_cycles_are_errors() -> None:
    with pytest.raises(PlanningError, match="no live workers"):
        CompassPolicy().plan(one(TaskSpec("t")), ClusterView.of([], MODELS))
    loop = DagSpec({"a": TaskSpec("a"), "b": TaskSpec("b")}, (("a", "b"), ("b", "a")))
    with pytest.raises(PlanningError, match="cycle"):
        CompassPolicy().plan(loop, cluster(worker("a")))


def test_unknown_policy_lists_known_ones() -> None:
    with pytest.raises(PlanningError, match="unknown policy 'fifo'; known: compass, heft"):
        get_policy("fifo")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_registry_builds_every_policy_with_its_name_and_reasons(name: str) -> None:
    policy = get_policy(name, seed=3)
    assert policy.name == name
    dag = DagSpec({"a": TaskSpec("a", "x"), "b": TaskSpec("b", "y")}, (("a", "b"),))
    plan = policy.plan(dag, cluster(worker("w1"), worker("w2")))
    assert plan.policy == name and list(plan.placements) == ["a", "b"]
    assert all(p.reason and p.finish_ms >= p.start_ms for p in plan.placements.values())


def test_heft_ignores_load_and_cache() -> None:
    c = cluster(worker("a", resident=frozenset({"x"}), backlog_ms=100.0), worker("b"))
    p = HeftPolicy().plan(one(TaskSpec("t", "x", 50.0)), c).placements["t"]
    assert (p.worker, p.load_ms, p.finish_ms) == ("b", 0.0, 50.0)


def test_jsq_joins_shortest_backlog_and_spreads_a_dag() -> None:
    c = cluster(worker("a", backlog_ms=30.0), worker("b", backlog_ms=10.0))
    dag = DagSpec({"s": TaskSpec("s", None, 50.0), "t": TaskSpec("t", None, 50.0)}, ())
    plan = JsqPolicy().plan(dag, c)
    assert (plan.worker_of("s"), plan.worker_of("t")) == ("b", "a")


def test_round_robin_cycles_across_calls_and_skips_small_gpus() -> None:
    c = cluster(worker("a"), worker("b", gpu_total_mb=1000.0), worker("c"))
    rr = RoundRobinPolicy()
    got = [rr.plan(one(TaskSpec("t", None)), c).worker_of("t") for _ in range(4)]
    assert got == ["a", "b", "c", "a"]
    got = [rr.plan(one(TaskSpec("t", "x")), c).worker_of("t") for _ in range(3)]
    assert got == ["c", "a", "c"]  # b cannot hold x


def test_random_is_reproducible_by_seed() -> None:
    c = cluster(*(worker(f"w{i}") for i in range(8)))

    def picks(seed: int) -> list[str]:
        pol = RandomPolicy(seed=seed)
        return [pol.plan(one(TaskSpec("t")), c).worker_of("t") for _ in range(10)]

    assert picks(1) == picks(1)
    assert len(set(picks(1))) > 1


def test_hash_is_stable_and_moves_little_when_a_worker_joins() -> None:
    names = [f"w{i}" for i in range(6)]
    models = {f"m{k}": 100.0 for k in range(40)}
    before = ClusterView.of([worker(n) for n in names], models)
    after = ClusterView.of([worker(n) for n in [*names, "w6"]], models)
    pol = HashPolicy()

    def owner(c: ClusterView, m: str) -> str:
        return pol.plan(one(TaskSpec("t", m)), c).worker_of("t")

    first = {m: owner(before, m) for m in models}
    assert first == {m: owner(before, m) for m in models}  # same answer every call
    assert len(set(first.values())) > 2  # and it spreads models out
    moved = {m for m in models if owner(after, m) != first[m]}
    assert all(owner(after, m) == "w6" for m in moved)  # only to the newcomer
    leaver = first["m0"]
    gone = ClusterView.of([worker(n) for n in names if n != leaver], models)
    kept = [m for m in models if first[m] != leaver]
    assert all(owner(gone, m) == first[m] for m in kept)


def test_shared_queue_names_no_worker_and_estimates_least_backlog() -> None:
    c = cluster(worker("a", backlog_ms=50.0), worker("b", backlog_ms=20.0))
    p = SharedQueuePolicy().plan(one(TaskSpec("t", None, 10.0)), c).placements["t"]
    assert (p.worker, p.queue, p.start_ms, p.finish_ms) == ("*", "*", 20.0, 30.0)
    assert "as if b" in p.reason
