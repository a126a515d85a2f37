"""Simulator: small deterministic runs with exact answers, then the workload-level claims."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from compass_celery.planner import POLICIES
from compass_celery.sim import compare_count_pending, simulate
from compass_celery.sim.engine import Engine
from compass_celery.workload import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]
EDGE = next((p for p in (ROOT / "shared" / "workloads" / "edge-vision.json",
                          Path("/work/shared/workloads/edge-vision.json"))
             if p.exists()), ROOT / "dags" / "edge-vision.json")
ALL = list(POLICIES)


def tiny(times_ms, *, workers=1, dags=None, gpu_mb=1000.0, host_mb=0.0):
    """One 150 MB model (100 ms to load at 1500 MB/s), 30 ms tasks, explicit arrivals."""
    return parse_workload({
        "name": "tiny",
        "models": {"m": 150, "n": 600},
        "dags": dags or {"one": {"nodes": {"a": {"model": "m", "exec_ms": 30}}}},
        "cluster": {"workers": workers, "gpu_mem_mb": gpu_mb, "load_mb_per_s": 1500,
                    "net_mb_per_s": 1000, "host_load_mb_per_s": 15000,
                    "host_mem_mb": host_mb},
        "arrivals": {"process": "explicit", "times_ms": times_ms},
    })


def stats(result, policy):
    return result["policies"][policy]


def test_engine_runs_in_time_then_schedule_order():
    eng, seen = Engine(), []
    eng.at(5, seen.append, "b")
    eng.at(1, seen.append, "a")
    eng.at(5, seen.append, "c")
    eng.at(3, lambda: eng.after(2, seen.append, "d"))
    assert eng.run() == 5 and seen == ["a", "b", "c", "d"]


@pytest.mark.parametrize("policy", ALL)
def test_cold_load_then_hit_exact_latencies(policy):
    r = stats(simulate(tiny([0, 1000]), [policy], warmup_frac=0), policy)
    assert r["completed"] == 2 and r["lost"] == r["failed"] == 0
    assert r["latency_ms"]["mean"] == pytest.approx((130 + 30) / 2)
    assert r["model_loads"] == 1 and r["cache_hit_rate"] == 0.5


def test_queueing_on_one_worker():
    r = stats(simulate(tiny([0, 0, 0]), ["compass"], warmup_frac=0), "compass")
    assert r["latency_ms"]["p50"] == pytest.approx(160) and r["latency_ms"]["mean"] == 160


def test_eviction_reload_comes_from_host_ram():
    dags = {"abc": {"nodes": {"a": {"model": "m", "exec_ms": 30},
                              "b": {"model": "n", "exec_ms": 30},
                              "c": {"model": "m", "exec_ms": 30}},
                    "edges": [["a", "b"], ["b", "c"]]}}
    r = stats(simulate(tiny([0], dags=dags, gpu_mb=700, host_mb=1000), ["compass"],
                       warmup_frac=0), "compass")
    # load m 100, run 30, evict m and load n 400, run 30, reload m from host RAM 10, run 30
    assert r["latency_ms"]["mean"] == pytest.approx(600)
    assert r["model_loads"] == 3 and r["cache_hit_rate"] == 0.0
    # without a host tier (the default) the reload costs the full load time again
    r = stats(simulate(tiny([0], dags=dags, gpu_mb=700), ["compass"], warmup_frac=0), "compass")
    assert r["latency_ms"]["mean"] == pytest.approx(690)


def test_celery_default_shares_one_queue_across_workers():
    r = stats(simulate(tiny([0, 0], workers=2), ["celery-default"], warmup_frac=0),
              "celery-default")
    assert r["latency_ms"]["mean"] == pytest.approx(130)  # both taken at once, both load
    assert r["model_loads"] == 2


def test_fan_out_join_completes_with_transfer():
    dags = {"fan": {"nodes": {"s": {"model": "m", "exec_ms": 10, "output_kb": 1000},
                              "x": {"model": "m", "exec_ms": 20},
                              "y": {"model": "m", "exec_ms": 20},
                              "j": {"model": "m", "exec_ms": 5}},
                    "edges": [["s", "x"], ["s", "y"], ["x", "j"], ["y", "j"]]}}
    for policy in ALL:
        r = stats(simulate(tiny([0, 5, 10], workers=3, dags=dags), [policy]), policy)
        assert r["completed"] == 3 and r["lost"] == 0, policy


@pytest.fixture(scope="module")
def edge():
    if not EDGE.exists():
        pytest.skip("shared edge-vision workload not present")
    return load_workload(EDGE)


@pytest.fixture(scope="module")
def edge_all(edge):
    return simulate(edge, ALL, jobs=300)


def test_every_job_completes_under_every_policy(edge_all):
    assert set(edge_all) == {"workload", "seed", "policies"}
    assert set(edge_all["policies"]) == set(ALL)
    keys = {"jobs", "completed", "failed", "lost", "latency_ms", "cache_hit_rate", "model_loads",
            "throughput_jobs_per_s", "breakdown_ms", "plan_ms", "loads_after_warmup",
            "load_fraction", "finish_error"}
    for name, r in edge_all["policies"].items():
        assert set(r) == keys and set(r["latency_ms"]) == {"mean", "p50", "p95", "p99"}
        assert (r["jobs"], r["completed"], r["failed"], r["lost"]) == (300, 300, 0, 0), name
        lat = r["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"], name
        assert r["throughput_jobs_per_s"] > 0 and 0 <= r["cache_hit_rate"] <= 1


@pytest.mark.parametrize(("seed", "rate"), [(11, 6), (1, 10), (2, 14)])
def test_compass_beats_celery_default_on_edge_vision(edge, seed, rate):
    w = dataclasses.replace(edge, seed=seed, arrivals=dataclasses.replace(edge.arrivals, seed=seed))
    r = simulate(w, ["compass", "celery-default"], rate=rate, jobs=300)["policies"]
    assert r["compass"]["latency_ms"]["mean"] < 0.9 * r["celery-default"]["latency_ms"]["mean"]
    assert r["compass"]["model_loads"] < r["celery-default"]["model_loads"]


def test_latencies_never_beat_the_lower_bound(edge):
    r = simulate(edge, ["compass"], jobs=200, warmup_frac=0)["policies"]["compass"]
    assert r["latency_ms"]["p50"] >= 47 - 1e-9  # the cheapest DAG's critical path


def test_deterministic_for_a_fixed_seed(edge):
    a = simulate(edge, ["compass", "random", "celery-default"], jobs=150)
    b = simulate(edge, ["compass", "random", "celery-default"], jobs=150)
    for r in (a, b):  # planning wall time is the one field that may differ
        assert all(p.pop("plan_ms")["p50"] > 0 for p in r["policies"].values())
    assert a == b


def test_count_pending_comparison_runs_both(edge):
    out = compare_count_pending(edge, jobs=150)["count_pending"]
    assert out["on"]["completed"] == out["off"]["completed"] == 150


@pytest.mark.parametrize("path", sorted((ROOT / "dags").glob("*.json")), ids=lambda p: p.name)
def test_repo_workloads_simulate_without_loss(path):
    w = load_workload(path)
    r = simulate(w, ["compass", "celery-default"], jobs=120)["policies"]
    # lost counts neither refusals nor sheds: a workload with SLOs may refuse some jobs
    assert all(v["lost"] == v["failed"] == 0 and (v["completed"] == 120 or w.dag_slo)
               for v in r.values())


def test_thousand_workers_quickly(edge):
    started = time.perf_counter()
    r = simulate(edge, ["compass", "celery-default"], workers=1000, rate=1500, jobs=1000)
    assert time.perf_counter() - started < 30
    assert all(v["completed"] == 1000 and v["lost"] == 0 for v in r["policies"].values())
