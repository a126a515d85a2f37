"""static-replicas: the simulator's static reference for compass's demand-aware replicas.

The assignment (replica targets from expected demand, greedy packing onto GPU memory),
the policy (earliest finish among the holders of a task's model), the cache pinning it
relies on, and a short simulation in which it loads nothing after warm-up.
"""

from __future__ import annotations

import json
import random

import pytest

from compass_celery.cache.decisions import CacheDecider, Evict, Load
from compass_celery.cache.errors import CacheFullError
from compass_celery.planner import POLICIES, ClusterView, DagSpec, TaskSpec, WorkerView
from compass_celery.planner.demand import replica_targets
from compass_celery.planner.static import (
    NAME,
    ReplicaAssignment,
    StaticReplicaPolicy,
    assign_replicas,
    expected_demand,
)
from compass_celery.planner.types import ModelDemand, PlanningError
from compass_celery.sim import simulate
from compass_celery.workload import parse_workload


def demand(**ms_per_s: float) -> dict[str, ModelDemand]:
    return {m: ModelDemand(ms, 2.0) for m, ms in ms_per_s.items()}


def check_memory(a: ReplicaAssignment, sizes: dict[str, float], gpu: dict[str, float]) -> None:
    for worker, models in a.by_worker().items():
        assert sum(sizes[m] for m in models) <= gpu[worker]
    for model, holders in a.holders.items():
        assert len(set(holders)) == len(holders)  # one replica per worker at most
        assert len(holders) + a.missing.get(model, 0) == a.targets[model]


def test_assignment_meets_targets_within_memory() -> None:
    sizes = {"busy": 1000.0, "mid": 2000.0, "cold": 500.0}
    gpu = {"w0": 3000.0, "w1": 3000.0, "w2": 3000.0}
    want = demand(busy=1700.0, mid=900.0, cold=10.0)  # 3, 2 and 1 replicas
    a = assign_replicas(want, sizes, gpu)
    assert dict(a.targets) == replica_targets(want) == {"busy": 3, "mid": 2, "cold": 1}
    assert not a.missing
    check_memory(a, sizes, gpu)
    # busy (1.7 ms/s per MB) first, on the most free memory (ties: name), then mid, cold;
    # then the second round: busy, mid
    assert a.holders["busy"] == ("w0", "w2", "w1")
    assert a.holders["mid"] == ("w1", "w0")
    assert a.holders["cold"] == ("w2",)
    assert a.by_worker() == {"w0": ("busy", "mid"), "w1": ("busy", "mid"), "w2": ("busy", "cold")}
    assert a.report()["assignment"]["busy"] == ["w0", "w2", "w1"]


def test_short_memory_drops_replicas_and_says_so() -> None:
    sizes = {"big": 2500.0, "busy": 1000.0, "cold": 500.0}
    gpu = {"w0": 3000.0, "w1": 3000.0, "w2": 2000.0}
    a = assign_replicas(demand(big=2000.0, busy=1700.0, cold=10.0), sizes, gpu)
    assert a.targets["big"] == 2  # 3 by demand, but it fits on two GPUs only
    assert a.missing and sum(a.missing.values()) > 0
    assert a.report()["replicas_missing"] == dict(a.missing)
    check_memory(a, sizes, gpu)
    assert all(len(a.holders[m]) >= 1 for m in sizes)  # first replicas go first


@pytest.mark.parametrize("seed", range(20))
def test_random_assignments_respect_memory(seed: int) -> None:
    rng = random.Random(seed)
    sizes = {f"m{i}": float(rng.randint(100, 4000)) for i in range(rng.randint(1, 8))}
    gpu = {f"w{i}": float(rng.randint(2000, 8000)) for i in range(rng.randint(1, 6))}
    want = {m: ModelDemand(rng.uniform(0, 3000), rng.uniform(0.01, 5)) for m in sizes}
    check_memory(assign_replicas(want, sizes, gpu), sizes, gpu)


def test_a_busy_model_gets_more_replicas_than_a_cold_one() -> None:
    dags = {"hot": DagSpec.single(TaskSpec("a", "busy", 400.0)),
            "rare": DagSpec({"b": TaskSpec("b", "cold", 50.0), "c": TaskSpec("c", None, 5.0)},
                            (("b", "c"),), "rare")}
    want = expected_demand(dags, {"hot": 3.0, "rare": 1.0}, rate_per_s=8.0)
    assert want["busy"] == ModelDemand(pytest.approx(2400.0), pytest.approx(6.0))
    assert want["cold"] == ModelDemand(pytest.approx(100.0), pytest.approx(2.0))
    a = assign_replicas(want, {"busy": 1000.0, "cold": 1000.0}, {f"w{i}": 4000.0 for i in range(5)})
    assert len(a.holders["busy"]) == 3 > len(a.holders["cold"]) == 1


def view(name: str, resident: set[str], sizes: dict[str, float], backlog: float = 0.0,
         gpu: float = 1000.0) -> WorkerView:
    used = sum(sizes[m] for m in resident)
    return WorkerView(name, name, gpu, gpu - used, frozenset(resident), backlog_ms=backlog)


def test_tasks_go_to_a_holder_even_when_another_worker_is_idle() -> None:
    sizes = {"m": 400.0, "n": 500.0}
    policy = StaticReplicaPolicy({"m": ["w0"]})
    cluster = ClusterView.of([view("w0", {"m"}, sizes, backlog=5000.0),
                              view("w1", set(), sizes)], sizes)
    plan = policy.plan(DagSpec.single(TaskSpec("t", "m", 50.0)), cluster)
    assert plan.policy == NAME and plan.worker_of("t") == "w0"
    assert plan.placements["t"].load_ms == 0.0
    # no model: earliest finish anywhere
    assert policy.plan(DagSpec.single(TaskSpec("t", None, 50.0)), cluster).worker_of("t") == "w1"


def test_a_model_without_replica_goes_where_it_fits_beside_the_pinned_ones() -> None:
    sizes = {"m": 900.0, "n": 500.0}
    policy = StaticReplicaPolicy({"m": ["w0"]})
    cluster = ClusterView.of([view("w0", {"m"}, sizes),  # idle, but 100 MB beside m
                              view("w1", set(), sizes, backlog=5000.0)], sizes)
    assert policy.plan(DagSpec.single(TaskSpec("t", "n", 50.0)), cluster).worker_of("t") == "w1"
    tight = ClusterView.of([view("w0", {"m"}, sizes)], sizes)
    with pytest.raises(PlanningError, match="no replica"):
        policy.plan(DagSpec.single(TaskSpec("t", "n", 50.0)), tight)


@pytest.mark.parametrize("seed", range(10))
def test_never_a_worker_without_the_model_when_a_holder_exists(seed: int) -> None:
    rng = random.Random(seed)
    sizes = {f"m{i}": 300.0 for i in range(4)}
    names = [f"w{i}" for i in range(6)]
    holders = {m: rng.sample(names, rng.randint(1, 3)) for m in sizes}
    policy = StaticReplicaPolicy(holders)
    pinned = policy.pinned
    cluster = ClusterView.of(
        [view(w, set(pinned.get(w, ())), sizes, backlog=rng.uniform(0, 3000), gpu=2000.0)
         for w in names], sizes)
    nodes = {f"t{k}": TaskSpec(f"t{k}", rng.choice(list(sizes)), rng.uniform(5, 500), 50.0)
             for k in range(6)}
    edges = tuple((f"t{k}", f"t{k + 1}") for k in range(5) if rng.random() < 0.6)
    plan = policy.plan(DagSpec(nodes, edges, "d"), cluster)
    for name, task in nodes.items():
        assert plan.worker_of(name) in holders[task.model]


def test_the_cache_never_evicts_a_pinned_model() -> None:
    d = CacheDecider(1000.0, "lookahead", sizes={"p": 600.0, "q": 300.0, "r": 300.0})
    d.on_loaded("p", now=0.0)
    d.pinned = frozenset({"p"})
    d.on_loaded("q", now=1.0)
    assert d.on_need("r", now=2.0) == [Evict("q"), Load("r", 300.0)]
    d.on_loaded("r", now=3.0)
    assert "p" not in d.victims()
    with pytest.raises(CacheFullError):
        d.on_need("q", size_mb=500.0, running="r", now=4.0)  # only p could make room
    assert "p" in d.resident


def small_workload(rate: float = 8.0, jobs: int = 240) -> object:
    """Three 2 GB workers; a hot model that keeps ~2 workers busy, two cold ones."""
    return parse_workload({
        "name": "small",
        "models": {"hot": 600, "cold": 800, "tiny": 400, "spare": 1500},
        "dags": {"hot": {"nodes": {"a": {"model": "hot", "exec_ms": 200}}},
                 "cold": {"nodes": {"b": {"model": "tiny", "exec_ms": 20, "output_kb": 10},
                                    "c": {"model": "cold", "exec_ms": 30}},
                          "edges": [["b", "c"]]},
                 "other": {"nodes": {"d": {"model": "spare", "exec_ms": 40}}}},
        "mix": {"hot": 0.7, "cold": 0.2, "other": 0.1},
        "cluster": {"workers": 3, "gpu_mem_mb": 2000, "load_mb_per_s": 1500},
        "arrivals": {"process": "poisson", "rate_per_s": rate, "jobs": jobs, "seed": 3},
    })


def test_short_simulation_loads_nothing_after_warmup() -> None:
    r = simulate(small_workload(), [NAME, "jsq"])["policies"]
    s = r[NAME]
    assert s["completed"] == 240 and s["failed"] == s["lost"] == 0
    assert s["loads_after_warmup"] == 0 and s["load_fraction"] == 0.0
    assert s["model_loads"] == 0  # preloaded, not loaded
    assert s["replica_targets"]["hot"] == 2 and len(s["assignment"]["hot"]) == 2
    assert not s["replicas_missing"]
    assert "assignment" not in r["jsq"]


def test_the_rate_sizes_the_assignment() -> None:
    low = simulate(small_workload(), [NAME], rate=2.0, jobs=20)["policies"][NAME]
    assert low["replica_targets"]["hot"] == 1


def test_static_replicas_is_simulator_only() -> None:
    assert NAME not in POLICIES


def test_the_command_selects_it(tmp_path) -> None:
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    path = tmp_path / "w.json"
    w = small_workload()
    path.write_text(json.dumps({
        "name": "small", "models": w.models,
        "dags": {"hot": {"nodes": {"a": {"model": "hot", "exec_ms": 200}}}},
        "cluster": {"workers": 2, "gpu_mem_mb": 2000},
        "arrivals": {"process": "poisson", "rate_per_s": 3, "jobs": 20}}))
    out_path = tmp_path / "r.json"
    run = CliRunner().invoke(compass_command, ["sim", "run", "--workload", str(path),
                                               "--policies", f"{NAME},jsq",
                                               "--json", str(out_path)])
    assert run.exit_code == 0, run.output
    out = json.loads(out_path.read_text())["policies"]
    assert set(out) == {NAME, "jsq"} and out[NAME]["assignment"] == {"hot": ["w000"]}
    bad = CliRunner().invoke(compass_command, ["sim", "run", "--workload", str(path),
                                               "--policies", "static"])
    assert bad.exit_code == 2 and "unknown policy 'static'" in bad.output
