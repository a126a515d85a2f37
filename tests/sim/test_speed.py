"""The simulator's live columns: the planner sees exactly what it would build itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass_celery.planner import POLICIES
from compass_celery.planner.cost import WorkerArrays, build_worker_arrays, worker_arrays
from compass_celery.sim.runner import Simulation
from compass_celery.workload import job_stream, load_workload

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [f.name for f in dataclasses.fields(WorkerArrays) if not f.name.startswith("_")]


def assert_same_arrays(got: WorkerArrays, want: WorkerArrays) -> None:
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert np.array_equal(a, b), name
        else:
            assert a == b, name


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("refresh_ms", [0.0, 25.0])
def test_live_columns_equal_a_fresh_build_throughout_a_run(policy, refresh_ms):
    w = load_workload(ROOT / "dags" / "edge-vision.json")
    # a host-RAM tier too, so host_resident and the host load bandwidth columns vary
    cluster = dataclasses.replace(w.cluster.scaled(12), workers=tuple(
        dataclasses.replace(s, host_mem_mb=2000.0, speed=(1.0, 2.0, 0.5)[i % 3])
        for i, s in enumerate(w.cluster.scaled(12).workers)))
    w = dataclasses.replace(w, cluster=cluster)
    sim = Simulation(w, policy, job_stream(w, rate=40.0, jobs=150), refresh_ms=refresh_ms)
    checked = loading = 0
    for until in np.arange(50.0, 5000.0, 97.0):
        sim.run(until)
        snap = sim.cluster.snapshot()
        live, fresh = worker_arrays(snap), build_worker_arrays(snap)
        assert_same_arrays(live, fresh)
        # the run rates kept row by row give a fresh build's backlogs, float for float
        for at in (snap.now, snap.now + 37.0):
            assert np.array_equal(live.backlog_left_ms(at), fresh.backlog_left_ms(at))
        # the memos the live columns hand on between snapshots answer as a fresh build's
        for model, size in snap.model_sizes_mb.items():
            flights = live.in_flight(model, size, snap.now)
            other = fresh.in_flight(model, size, snap.now)
            # (worker, ms left) pairs: the live rows are in the order their loads began
            pairs = dict(zip(flights.at.tolist(), flights.left.tolist(), strict=True))
            assert pairs == dict(zip(other.at.tolist(), other.left.tolist(), strict=True)), model
            loading += bool(pairs)
            assert live.fits_any(size) == fresh.fits_any(size)
        # loads_ahead's memo, handed on between snapshots, answers as a fresh build's
        for at in (snap.now, snap.now + 37.0):
            busy, ends = live.loads_ahead(snap.model_sizes_mb, at)
            want_busy, want_ends = fresh.loads_ahead(snap.model_sizes_mb, at)
            assert np.array_equal(busy, want_busy) and ends == want_ends
        # each worker's record, its cache fields kept until the cache changes, reads as
        # the worker's state afresh
        for worker in sim.cluster.workers:
            view, cache = worker.view(), worker.decider
            assert view.gpu_free_mb == cache.free_mb()
            assert view.resident == frozenset(cache.resident)
            assert view.host_resident == frozenset(worker.host)
            assert view.loading == worker.in_flight
        checked += any(v.backlog_ms > 0 and v.resident for v in snap.workers)
    assert checked > 5  # the states compared were not all empty
    assert loading > 5  # and loads were under way in some
    assert all(j.end is not None for j in sim.run())


def test_a_snapshot_keeps_its_columns_when_workers_change():
    w = load_workload(ROOT / "dags" / "edge-vision.json")
    sim = Simulation(w, "compass", job_stream(w, jobs=60))
    sim.run(300.0)
    snap = sim.cluster.snapshot()
    before = build_worker_arrays(snap)
    sim.run(900.0)
    assert sim.cluster.snapshot() is not snap
    assert_same_arrays(worker_arrays(snap), before)


def _whole_queue(self, skip=None):
    """The pre-speedup reference: every queued task's model (but the one starting)."""
    return [t.model for t in self.queue if t is not skip]


@pytest.mark.parametrize("policy", ["hash", "round-robin", "jsq"])
def test_cut_queue_view_decides_as_the_whole_queue(policy, monkeypatch):
    # overloaded (queues tens to hundreds long, several models each): the cut must not matter
    from compass_celery.sim import simulate
    from compass_celery.sim.cluster import SimWorker

    w = load_workload(ROOT / "dags" / "edge-vision.json")
    kw = {"rate": 25.0, "jobs": 400}
    longest = []
    cut = SimWorker._queued

    def spy(self, skip=None):
        longest.append(len(self.queue))
        return cut(self, skip)

    monkeypatch.setattr(SimWorker, "_queued", spy)
    fast = simulate(w, [policy], **kw)["policies"][policy]
    monkeypatch.setattr(SimWorker, "_queued", _whole_queue)
    slow = simulate(w, [policy], **kw)["policies"][policy]
    fast.pop("plan_ms"), slow.pop("plan_ms")
    assert fast == slow
    assert max(longest) >= 50  # the queues really were long


def plan_timing(*args: str) -> Any:
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    return CliRunner().invoke(compass_command, ["bench", "plan-timing", *args])


def test_plan_timing_live_case_and_policies():
    run = plan_timing("--workers", "2000", "--reps", "20", "--policies", "compass,hash",
                      "--snapshots", "cold,live")
    assert run.exit_code == 0, run.output
    rows = [line.split() for line in run.output.splitlines()[1:]]
    assert {(r[2], r[5]) for r in rows} == {(k, p) for k in ("cold", "live")
                                           for p in ("compass", "hash")}
    med = {(r[1], r[2], r[5]): float(r[3]) for r in rows}
    # ready columns spare the pass over 2,000 workers that a cold snapshot pays
    assert med[("1-task", "live", "compass")] * 2 < med[("1-task", "cold", "compass")]


def test_plan_timing_rejects_unknown_names():
    assert "unknown policy 'fastest'" in plan_timing("--policies", "fastest").output
    assert "unknown snapshot kind 'lukewarm'" in plan_timing("--snapshots", "lukewarm").output


@pytest.mark.parametrize("policy", ["compass", "celery-default", "hash"])
def test_planning_never_walks_every_worker(policy, monkeypatch):
    # the per-job pass over all workers is what made 1,000-worker runs slow: none is left
    import compass_celery.planner.cost as cost

    calls = []
    real = cost.build_worker_arrays
    monkeypatch.setattr(cost, "build_worker_arrays", lambda c: calls.append(1) or real(c))
    w = load_workload(ROOT / "dags" / "edge-vision.json")
    sim = Simulation(w, policy, job_stream(w, rate=300.0, jobs=300), workers=200)
    assert all(j.end is not None for j in sim.run())
    assert calls == []


def test_fewer_collections_restores_the_threshold():
    import gc

    from compass_celery.sim.runner import GC_YOUNG_THRESHOLD, fewer_collections

    was = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_collections():
        assert gc.get_threshold()[0] == max(was[0], GC_YOUNG_THRESHOLD)
        raise RuntimeError
    assert gc.get_threshold() == was


def test_a_fresh_snapshots_records_are_built_when_read_and_never_read_stale():
    """A snapshot's workers are built on read (``sim.cluster.Records``): each reads as its
    worker's record at the snapshot, and a record not built before its worker changed
    (or before a newer snapshot) raises rather than give the later state."""
    w = load_workload(ROOT / "dags" / "edge-vision.json")
    sim = Simulation(w, "compass", job_stream(w, rate=40.0, jobs=150))
    sim.run(400.0)
    snap = sim.cluster.snapshot()
    assert snap.workers[0] is sim.cluster.workers[0].view()  # the worker's own record
    assert list(snap.workers) == [x.view() for x in sim.cluster.workers]
    assert tuple(snap.workers[1:3]) == tuple(snap.workers)[1:3]
    sim.run(1200.0)
    stale = sim.cluster.workers[0]
    stale.touch()
    fresh = sim.cluster.snapshot()  # row 0 re-read: its record is built when read
    assert fresh is not snap
    assert list(snap.workers)  # built before: still readable
    stale.touch()  # changed after the snapshot, its record not read yet
    with pytest.raises(RuntimeError):
        _ = fresh.workers[0]
    newer = sim.cluster.snapshot()
    assert newer.workers[0] is stale.view()
    assert list(newer.workers) == [x.view() for x in sim.cluster.workers]
    sim.cluster.workers[1].touch()
    whole = sim.cluster.snapshot()  # newer's records were read: this one is built whole
    sim.cluster.workers[1].touch()
    lazy = sim.cluster.snapshot()  # whole's were not read: row 1 is built when read
    sim.cluster.workers[2].touch()
    sim.cluster.snapshot()
    assert whole.workers[1] is not None  # built with its snapshot: still readable
    with pytest.raises(RuntimeError):  # a newer snapshot was built: an unread row expired
        _ = lazy.workers[1]
