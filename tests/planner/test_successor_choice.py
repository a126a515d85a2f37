"""The simulator and the worker runtime re-place a released successor the same way.

Both call ``planner.adjust.choose_successor``; these tests hold them to it by building
one cluster state in the simulator, then asking the simulator (``Simulation._target``)
and the runtime (``JobRuntime._send_successor`` with the same snapshot behind a stand-in
state reader) where the successor goes: cases where it stays and where it moves.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from compass_celery.jobs import runtime as job_runtime
from compass_celery.jobs.runtime import JobRuntime
from compass_celery.planner.adjust import DEFAULT_MOVE_FACTOR, choose_successor, reassign
from compass_celery.planner.types import ClusterView, TaskSpec, WorkerView
from compass_celery.settings import OPTIONS, resolve
from compass_celery.sim.runner import MOVE_FACTOR, Job, Simulation
from compass_celery.workload import parse_workload

WORKLOAD = {
    "name": "successors",
    "models": {"m": 900},
    "dags": {
        # run 120 ms, so a planned worker goes stale past 1.5 x 120 = 180 ms of backlog
        "pipe": {"nodes": {"d": {"exec_ms": 10, "output_kb": 40},
                           "c": {"model": "m", "exec_ms": 120}},
                 "edges": [["d", "c"]]},
        # a's 100 MB output sits on w000: pulling it elsewhere costs 100 ms at 1000 MB/s
        "join": {"nodes": {"a": {"exec_ms": 10, "output_kb": 100_000},
                           "b": {"exec_ms": 10, "output_kb": 1000},
                           "j": {"model": "m", "exec_ms": 120}},
                 "edges": [["a", "j"], ["b", "j"]]},
    },
    "cluster": {"workers": 3, "gpu_mem_mb": 1600, "load_mb_per_s": 1500, "net_mb_per_s": 1000},
    "arrivals": {"process": "poisson", "rate_per_s": 1, "jobs": 1},
}


def sim_with(backlogs: dict[str, float], *, factor: float = MOVE_FACTOR) -> Simulation:
    """A compass simulation whose workers carry these backlogs (nothing queued, no models)."""
    sim = Simulation(parse_workload(WORKLOAD), "compass", [], move_factor=factor)
    for name, ms in backlogs.items():
        worker = sim.cluster.by_name[name]
        worker.backlog_ms = ms
        worker.touch()
    return sim


def job_at(sim: Simulation, dag: str, node: str, where: dict[str, str]) -> Job:
    """A job of ``dag`` whose predecessors of ``node`` finished on ``where``, planned on w000."""
    job = Job(0, sim.workload.dags[dag], 0.0)
    job.planned[node] = "w000"
    job.where.update(where)
    return job


def runtime_choice(sim: Simulation, job: Job, node: str, factor: float,
                   monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the worker runtime sends ``node``, reading the simulator's snapshot as its state."""
    snap = sim.cluster.snapshot()
    published: dict[str, Any] = {}

    def publish(c, job_id, succ, node_json, placement, ref, moved_from, task_id, planned=None,
                remember=True):
        published.update(placement=placement, moved_from=moved_from, planned=planned)

    monkeypatch.setattr(job_runtime, "publish_node", publish)
    compass = SimpleNamespace(
        reader=SimpleNamespace(get=lambda ahead_s=None: SimpleNamespace(
            workers=list(snap.workers), taken_at=snap.now, profiles={})),
        model_sizes=lambda: dict(snap.model_sizes_mb),
        settings=resolve({"compass_move_factor": factor,
                          "compass_snapshot_refresh_ahead_s": 0.05, "compass_batch_aware": True}),
        policy=SimpleNamespace(adjusts=True),
    )
    rt = JobRuntime.__new__(JobRuntime)  # no Redis: only the adjustment path runs
    rt.c, rt.name = compass, "w001"
    dag = job.dag
    spec = dag.nodes[node]
    preds = dag.preds(node)
    where: dict[str, float] = {}
    for p in preds:  # complete.lua hands the runtime KB of inputs per worker
        where[job.where[p]] = where.get(job.where[p], 0.0) + dag.nodes[p].output_kb
    node_json = {"model": spec.model, "exec_ms": spec.exec_ms, "output_kb": spec.output_kb,
                 "preds": preds}
    planned = {"worker": job.planned[node], "run_ms": spec.exec_ms}
    rt._send_successor("job-1", node, f"job-1.{node}", node_json, planned, where)
    placement = published["placement"]
    assert (published["moved_from"] is None) == (placement is planned)
    return placement["worker"] if placement is planned else placement.worker


CASES = [
    # (dag, node, where the predecessors ran, backlogs, factor, expected worker)
    ("pipe", "c", {"d": "w000"}, {"w000": 100.0}, MOVE_FACTOR, "w000"),  # within 1.5x run
    ("pipe", "c", {"d": "w000"}, {"w000": 300.0, "w001": 400.0, "w002": 400.0},
     MOVE_FACTOR, "w000"),  # stale, but nobody finishes sooner
    ("pipe", "c", {"d": "w000"}, {"w000": 300.0, "w001": 50.0}, MOVE_FACTOR, "w002"),
    ("pipe", "c", {"d": "w000"}, {"w000": 300.0, "w001": 50.0}, 5.0, "w000"),  # 300 < 5 x 120
    ("pipe", "c", {"d": "w001"}, {"w000": 5000.0, "w002": 30.0}, MOVE_FACTOR, "w001"),
    # a join moves only when the gain beats the extra 100 ms of pulling a's output
    ("join", "j", {"a": "w000", "b": "w001"}, {"w000": 200.0, "w001": 1000.0},
     MOVE_FACTOR, "w000"),
    ("join", "j", {"a": "w000", "b": "w001"}, {"w000": 400.0, "w001": 1000.0},
     MOVE_FACTOR, "w002"),
]


@pytest.mark.parametrize(("dag", "node", "where", "backlogs", "factor", "expected"), CASES)
def test_simulator_and_runtime_send_the_successor_to_the_same_worker(
        dag, node, where, backlogs, factor, expected, monkeypatch) -> None:
    sim = sim_with(backlogs, factor=factor)
    job = job_at(sim, dag, node, where)
    assert sim._target(job, node) == expected
    assert runtime_choice(sim, job, node, factor, monkeypatch) == expected
    assert sim.moved == (expected != "w000")


@pytest.mark.parametrize(("dag", "node", "where", "backlogs", "factor", "expected"), CASES)
def test_the_shortcut_gives_reassigns_answer(dag, node, where, backlogs, factor,
                                             expected) -> None:
    """With the planned worker's record (the simulator's cheap path) or without it."""
    sim = sim_with(backlogs, factor=factor)
    task, snap = sim.workload.dags[dag].nodes[node], sim.cluster.snapshot()
    inputs: dict[str, float] = {}
    for p, w in where.items():
        inputs[w] = inputs.get(w, 0.0) + sim.workload.dags[dag].nodes[p].output_kb
    kw = {"factor": factor, "is_join": dag == "join", "adjusts": True}
    full = choose_successor(task, "w000", snap, inputs, **kw)
    quick = choose_successor(task, "w000", sim.cluster.snapshot, inputs, **kw,
                             planned=sim.cluster.by_name["w000"].view())
    assert full == quick == reassign(task, "w000", snap, inputs, factor=factor,
                                     is_join=dag == "join")
    assert (full.worker if full else "w000") == expected


def test_no_move_without_adjusting_policy_or_live_workers() -> None:
    task = TaskSpec("t", "m", 100.0)
    busy = ClusterView.of([WorkerView("a", "q.a", 2000.0, 2000.0, backlog_ms=1e6),
                           WorkerView("b", "q.b", 2000.0, 2000.0)], {"m": 900.0})
    kw = {"factor": 1.5, "is_join": False}
    assert choose_successor(task, "a", busy, {}, adjusts=True, **kw).worker == "b"
    assert choose_successor(task, "a", busy, {}, adjusts=False, **kw) is None
    assert choose_successor(task, "a", ClusterView.of([], {"m": 900.0}), {}, adjusts=True,
                            **kw) is None
    # a job planned without state (shared queue) is placed once state is back
    assert choose_successor(task, "*", busy, {}, adjusts=True, **kw).worker == "b"


def test_simulator_move_factor_defaults_to_the_runtime_setting() -> None:
    assert MOVE_FACTOR == OPTIONS["move_factor"].default == DEFAULT_MOVE_FACTOR
    assert Simulation(parse_workload(WORKLOAD), "compass", []).move_factor == MOVE_FACTOR


def test_a_successor_with_a_deadline_is_placed_on_state_no_older_than_the_ttl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime asks its reader for state within the TTL (no read-ahead) for a node whose
    job has a deadline, and lets others plan on a snapshot read ahead."""
    asked: list[float | None] = []
    snap = sim_with({}).cluster.snapshot()

    def get(ahead_s: float | None = None) -> SimpleNamespace:
        asked.append(ahead_s)
        return SimpleNamespace(workers=list(snap.workers), taken_at=snap.now, profiles={})

    monkeypatch.setattr(job_runtime, "publish_node", lambda *a, **k: None)
    rt = JobRuntime.__new__(JobRuntime)
    rt.c = SimpleNamespace(
        reader=SimpleNamespace(get=get), model_sizes=lambda: dict(snap.model_sizes_mb),
        settings=resolve({"compass_snapshot_refresh_ahead_s": 0.05}),
        policy=SimpleNamespace(adjusts=False))
    rt.name = "w001"
    node = {"model": None, "exec_ms": 1.0, "output_kb": 0.0, "preds": ["a"]}
    rt._send_successor("job-1", "b", "job-1.b", node, None, {})
    rt._send_successor("job-2", "b", "job-2.b", {**node, "due": 1e9}, None, {})
    assert asked == [0.05, 0.0]
