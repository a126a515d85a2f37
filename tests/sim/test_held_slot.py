"""The held slot in the simulator: a worker runs ``worker.core.slot_held_until`` and does
not start a batch task while an interactive successor is planned on it, within the bound."""

from __future__ import annotations

from types import SimpleNamespace

from compass_celery.settings import OPTIONS
from compass_celery.sim import Simulation
from compass_celery.sim.cluster import SimCluster, SimTask
from compass_celery.sim.engine import Engine
from compass_celery.sim.options import SimOptions
from compass_celery.sim.runner import simulate
from compass_celery.workload import WorkerSpec, job_stream, load_workload

SPEC = WorkerSpec("w0", gpu_mem_mb=1000.0, load_mb_per_s=1e9)


def one_worker(hold_max_ms: float) -> tuple[Engine, SimCluster, list[SimTask]]:
    engine, done = Engine(), []
    cluster = SimCluster((SPEC,), engine, {"m": 1.0}, shared=False,
                         on_done=lambda t, w: done.append(t), on_failed=lambda t, w: None,
                         hold_max_ms=hold_max_ms)
    cluster.workers[0].warm(["m"])
    return engine, cluster, done


def batch_task(name: str) -> SimTask:
    return SimTask(None, name, "m", 500.0, level=0)


def test_a_batch_task_waits_for_the_planned_successor_then_runs() -> None:
    engine, cluster, done = one_worker(1000.0)
    (w,) = cluster.workers
    w.add_pending(100.0, level=9)  # an interactive successor is planned here
    batch = batch_task("b")
    w.enqueue(batch)
    engine.run(until_ms=200.0)
    assert w.running is None and batch.start_at < 0  # held: the slot is free
    later = SimTask(None, "s", "m", 100.0, level=9, later=True)
    engine.at(200.0, w.add_pending, -100.0, 9)  # sent: planned work released ...
    engine.at(200.0, w.enqueue, later)          # ... and the successor arrives
    engine.run()
    assert [t.node for t in done] == ["s", "b"]
    assert later.start_at == 200.0 and batch.start_at == 300.0
    assert cluster.slot_holds == 1


def test_a_lower_task_with_a_deadline_is_not_held_one_without_is() -> None:
    """Only work without a deadline is held: a level-0 task of a job with a deadline
    starts at once though an interactive successor is planned; one without waits."""
    engine, cluster, done = one_worker(1000.0)
    (w,) = cluster.workers
    w.add_pending(100.0, level=9)
    standard = SimTask(SimpleNamespace(due=3000.0), "d", "m", 500.0, level=0)
    batch = batch_task("b")
    w.enqueue(standard)
    w.enqueue(batch)
    engine.run(until_ms=700.0)
    assert standard.start_at == 0.0  # its deadline: never held
    assert batch.start_at < 0 and w.running is None  # no deadline: held after it
    assert cluster.slot_holds == 1
    engine.run()
    assert batch.start_at == 1500.0  # the hold began at 500, bound 1000


def test_a_leaked_planned_count_holds_batch_only_until_the_bound() -> None:
    """The successor never comes (its job failed; the count left set): batch runs at the
    bound, and every batch task still runs."""
    engine, cluster, done = one_worker(300.0)
    (w,) = cluster.workers
    w.add_pending(100.0, level=9)
    tasks = [batch_task(f"b{i}") for i in range(3)]
    for t in tasks:
        w.enqueue(t)
    engine.run()
    assert [t.node for t in done] == ["b0", "b1", "b2"]
    assert [t.start_at for t in tasks] == [300.0, 1100.0, 1900.0]  # each held <= 300 ms


def test_the_simulator_takes_the_settings_default_off() -> None:
    """One default for the workers, the producer and the simulator: the setting's, off
    (it would also hold a lower class that has a deadline of its own)."""
    assert SimOptions().hold_max_ms == OPTIONS["hold_max_ms"].default == 0.0
    w = load_workload("dags/navigator-mixed.json")
    sim = Simulation(w, "compass", job_stream(w), rate=8.0, jobs=60)
    sim.run()
    assert sim.cluster.slot_holds == 0
    held = Simulation(w, "compass", job_stream(w), rate=8.0, jobs=60, hold_max_ms=1000.0)
    held.run()
    assert held.cluster.slot_holds > 0


def test_never_holds_without_a_bound() -> None:
    engine, cluster, done = one_worker(0.0)
    (w,) = cluster.workers
    w.add_pending(100.0, level=9)
    w.enqueue(batch_task("b"))
    engine.run()
    assert done[0].start_at == 0.0 and cluster.slot_holds == 0


def test_navigator_mixed_holds_and_loses_no_batch_job() -> None:
    """On the mixed workload past capacity, workers hold, and every batch job still
    completes (none lost, none shed)."""
    w = load_workload("dags/navigator-mixed.json")
    r = simulate(w, ["compass"], SimOptions(rate=8.0, jobs=200, hold_max_ms=1000.0))
    res = r["policies"]["compass"]
    batch = res["slo"]["batch"]
    assert batch["admitted"] == batch["jobs"] == batch["met"] and batch["shed"] == 0
    assert res["lost"] == 0
    sim = Simulation(w, "compass", job_stream(w), rate=8.0, jobs=200, hold_max_ms=1000.0)
    sim.run()
    assert sim.cluster.slot_holds > 0
