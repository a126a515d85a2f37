"""Priorities in the simulator: the real worker's queue rules (``worker.core``), the
router's levels per SLO class, and the planner's view of what a level overtakes."""

from __future__ import annotations

import ast
import inspect
import json
import operator
from pathlib import Path
from statistics import mean

import pytest

from compass_celery.planner.priority import ahead_ms
from compass_celery.sim import Simulation
from compass_celery.sim import cluster as sim_cluster
from compass_celery.sim import runner as sim_runner
from compass_celery.worker import core
from compass_celery.workload import job_stream, parse_workload

ROOT = Path(__file__).resolve().parents[2]
ONE = {"nodes": {"a": {"model": "m", "exec_ms": 30}}}


def mixed(*, rate: float = 50.0, jobs: int = 400, workers: int = 1,
          interactive: float = 0.25) -> dict:
    """Interactive (level 9) and batch (level 0) single-task jobs of 30 ms, a quarter
    interactive by default, on one worker: 33 jobs/s of capacity, so 50/s is past it
    (the interactive share alone is well within it). No deadlines, so nothing is
    refused or shed and only the order of service differs."""
    return {
        "name": "mixed", "models": {"m": 150},
        "dags": {"chat": ONE, "crunch": ONE},
        "mix": {"chat": interactive, "crunch": 1.0 - interactive},
        "cluster": {"workers": workers, "gpu_mem_mb": 1000, "load_mb_per_s": 1500,
                    "net_mb_per_s": 1000},
        "arrivals": {"process": "poisson", "rate_per_s": rate, "jobs": jobs, "seed": 5},
        "slo": {"classes": {"urgent": {"deadline_ms": None, "on_miss": "late",
                                       "priority": "interactive"},
                            "bulk": {"deadline_ms": None, "on_miss": "late",
                                     "priority": "batch"}},
                "dags": {"chat": "urgent", "crunch": "bulk"}},
    }


def latencies(sim: Simulation) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"chat": [], "crunch": []}
    for job in sim.jobs:
        assert job.end is not None
        out[job.dag.name].append(job.end - job.arrival)
    return out


def run(raw: dict, policy: str = "compass", **kw) -> Simulation:
    w = parse_workload(raw)
    sim = Simulation(w, policy, job_stream(w), **kw)
    sim.run()
    return sim


@pytest.mark.parametrize("policy", ["compass", "jsq", "celery-default"])
def test_interactive_tasks_overtake_queued_batch_tasks(policy):
    sim = run(mixed(), policy)
    lat = latencies(sim)
    assert len(lat["chat"]) > 50 and len(lat["crunch"]) > 200
    # past capacity the queue grows; level 9 keeps the front, level 0 waits it out
    assert mean(lat["chat"]) * 10 < mean(lat["crunch"])
    assert max(lat["chat"]) < 200.0  # a few runs ahead at most, however long the queue
    assert {j.level for j in sim.jobs} == {0, 9}  # the classes' levels, as the router's


def test_ageing_bounds_how_long_batch_work_waits():
    # interactive work alone keeps the worker 90% busy: batch work starves behind it
    raw = mixed(rate=37.0, jobs=800, interactive=0.8)
    never = latencies(run(raw, priority_age_s=0.0))
    ageing = latencies(run(raw, priority_age_s=0.5))
    assert max(never["crunch"]) > 8_000.0
    # promoted one level per 0.5 s waited: after 4.5 s a batch task is served as urgent
    assert max(ageing["crunch"]) < 4_500.0 + 500.0
    assert max(ageing["chat"]) > max(never["chat"])  # the price: urgent work waits too


def test_workers_publish_queued_work_per_level_and_plans_skip_lower_levels():
    w = parse_workload(mixed(jobs=200))
    sim = Simulation(w, "compass", job_stream(w))
    sim.run(2_000.0)  # mid-run: the queue has grown
    view = sim.cluster.workers[0].view()
    assert set(view.queued_ms) == {0, 9} and view.queued_ms[0] > 100.0
    waiting = sum(view.queued_ms.values())
    assert waiting == pytest.approx(view.backlog_ms - 30.0, abs=30.0)  # all but the runner
    seen = sim.cluster.leveled(9).workers[0]
    assert seen.backlog_ms == pytest.approx(ahead_ms(view, 9))
    assert seen.backlog_ms < view.backlog_ms - 100.0
    assert sim.cluster.leveled(0) is sim.cluster.snapshot()


def test_a_workload_without_priorities_plans_on_the_snapshot_itself(monkeypatch):
    raw = mixed(jobs=80)
    del raw["slo"]
    seen = []
    w = parse_workload(raw)
    sim = Simulation(w, "compass", job_stream(w))
    plan = sim.policy.plan
    monkeypatch.setattr(sim.policy, "plan",
                        lambda dag, snap: seen.append(snap is sim.cluster.snapshot())
                        or plan(dag, snap))
    sim.run()
    assert seen and all(seen) and {j.level for j in sim.jobs} == {0}


@pytest.mark.parametrize("refresh_ms", [0.0, 25.0])
def test_the_leveled_cluster_is_for_priority_of_the_snapshot(refresh_ms):
    """Kept row by row, it must equal the planner's own for_priority and the columns a
    fresh build gives, throughout a run with priorities."""
    import dataclasses

    import numpy as np

    from compass_celery.planner.cost import build_worker_arrays, worker_arrays
    from compass_celery.planner.priority import for_priority
    from tests.sim.test_speed import assert_same_arrays

    w = parse_workload(json.loads((ROOT / "dags" / "bursty-mixed.json").read_text()))
    w = dataclasses.replace(w, cluster=w.cluster.scaled(12))
    sim = Simulation(w, "compass", job_stream(w, rate=90.0, jobs=500), refresh_ms=refresh_ms)
    lowered = 0
    for until in np.arange(40.0, 6000.0, 61.0):
        sim.run(until)
        for level in (9, 5):
            snap, seen = sim.cluster.snapshot(), sim.cluster.leveled(level)
            want = for_priority(snap.workers, level)
            assert [v.backlog_ms for v in seen.workers] == [v.backlog_ms for v in want]
            # for_priority gives the very records when nothing is lowered
            assert (seen is snap) == all(map(operator.is_, want, snap.workers))
            assert seen.now == snap.now and seen.demand == snap.demand
            assert_same_arrays(worker_arrays(seen), build_worker_arrays(seen))
            lowered += seen is not snap
    assert lowered > 20  # batch work really was queued under the urgent plans


# -- one home for each rule: the simulator runs the worker core, it has no copy ---------

CORE_RULES = {name for name, obj in vars(core).items()
              if inspect.isfunction(obj) and obj.__module__ == core.__name__
              and not name.startswith("_")}
SIM_DIR = Path(sim_cluster.__file__).parent


def test_the_simulator_defines_no_queue_rule_of_its_own():
    tree = ast.parse((SIM_DIR / "cluster.py").read_text())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "worker.core" for a in node.names}
    assert {"LevelQueue", "drop_at_dequeue", "batch_close_at"} <= imported
    called = {n.func.id for n in ast.walk(tree)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    # the rules the core delegates to are not called around it
    assert not called & {"should_shed", "hold_until_ms", "aged", "latest_start"}
    for path in SIM_DIR.glob("*.py"):
        defined = {n.name for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert not defined & (CORE_RULES | {"LevelQueue"}), path.name
    assert sim_runner.PRIORITY_AGE_S == 10.0  # compass_priority_age_s's default


def test_simulated_workers_call_the_core(monkeypatch):
    calls = {"next": 0, "drop": 0, "hold": 0}

    def count(name, real):
        def spy(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)
        return spy

    monkeypatch.setattr(core, "next_index", count("next", core.next_index))
    monkeypatch.setattr(sim_cluster, "drop_at_dequeue", count("drop", core.drop_at_dequeue))
    monkeypatch.setattr(sim_cluster, "batch_close_at", count("hold", core.batch_close_at))
    raw = mixed(jobs=120)
    raw["dags"]["crunch"] = {"nodes": {"a": {"model": "m", "exec_ms": 30,
                                             "batch": {"max_size": 4, "max_wait_ms": 5}}}}
    raw["slo"]["classes"]["bulk"].update(deadline_ms=60_000, on_miss="reject")
    run(raw)
    assert all(calls.values()), calls


def test_batch_work_planned_ahead_does_not_lock_an_urgent_class_out() -> None:
    """Batch jobs whose long second step is planned but not sent yet (pending work) must
    not count ahead of an interactive job, which overtakes that step once it is sent:
    counted whole, they made every interactive plan miss its deadline and be refused."""
    two_step = {"nodes": {"a": {"model": "m", "exec_ms": 20}, "b": {"model": "m",
                                                                    "exec_ms": 300}},
                "edges": [["a", "b"]]}
    raw = {"name": "planned-ahead", "models": {"m": 150},
           "dags": {"chat": ONE, "crunch": two_step}, "mix": {"chat": 0.5, "crunch": 0.5},
           "cluster": {"workers": 2, "gpu_mem_mb": 1000, "load_mb_per_s": 1500,
                       "net_mb_per_s": 1000},
           "arrivals": {"process": "poisson", "rate_per_s": 16, "jobs": 400, "seed": 3},
           "slo": {"classes": {"urgent": {"deadline_ms": 500, "on_miss": "reject",
                                          "priority": "interactive"}},
                   "dags": {"chat": "urgent", "crunch": "batch"}}}
    result = sim_runner.simulate(parse_workload(raw), ["compass"], warm=True)
    urgent = result["policies"]["compass"]["slo"]["urgent"]
    # past capacity (8 batch jobs a second of 320 ms and 8 urgent of 30 ms on 2 workers,
    # 140%): an urgent job waits at most for one batch step in flight, so every one is
    # admitted and meets its deadline
    assert urgent["admitted"] == urgent["jobs"] > 50, urgent
    assert urgent["admitted_attainment"] >= 0.99, urgent
