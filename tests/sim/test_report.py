"""What simulate reports beside latency: plan_ms, the per-task breakdown, the modelled hop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compass_celery.cli import compass_command
from compass_celery.planner import POLICIES
from compass_celery.sim import simulate
from compass_celery.workload import load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "dags" / "edge-vision.json"
PARTS = ("queued_ms", "load_ms", "hop_ms", "run_ms")
CHAIN = {"abc": {"nodes": {"a": {"model": "m", "exec_ms": 30},
                           "b": {"model": "n", "exec_ms": 30},
                           "c": {"model": "m", "exec_ms": 30}},
                 "edges": [["a", "b"], ["b", "c"]]}}


def tiny(times_ms, *, workers=1, dags=None, gpu_mb=1000.0):
    """One 150 MB model (100 ms to load at 1500 MB/s), 30 ms tasks, explicit arrivals."""
    return parse_workload({
        "name": "tiny", "models": {"m": 150, "n": 600},
        "dags": dags or {"one": {"nodes": {"a": {"model": "m", "exec_ms": 30}}}},
        "cluster": {"workers": workers, "gpu_mem_mb": gpu_mb, "load_mb_per_s": 1500,
                    "net_mb_per_s": 1000},
        "arrivals": {"process": "explicit", "times_ms": times_ms},
    })


def outcome(result):
    """A result without its wall-clock field (plan_ms), which differs run to run."""
    return {n: {k: v for k, v in r.items() if k != "plan_ms"}
            for n, r in result["policies"].items()}


def one(workload, policy="compass", **kw):
    return simulate(workload, [policy], warmup_frac=0, **kw)["policies"][policy]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_plan_ms_and_breakdown_present_for_every_policy(policy):
    r = one(load_workload(EDGE), policy, jobs=40)
    assert set(r["plan_ms"]) == {"p50", "p99"}
    assert 0 < r["plan_ms"]["p50"] <= r["plan_ms"]["p99"] < 1000
    assert set(r["breakdown_ms"]) == set(PARTS)
    assert r["breakdown_ms"]["run_ms"] > 0 and r["breakdown_ms"]["hop_ms"] == 0


def test_breakdown_exact_on_one_worker():
    # three jobs at once: load 100 + run 30, then two wait 130 and 160 ms behind it
    r = one(tiny([0, 0, 0]))
    b = r["breakdown_ms"]
    assert b["load_ms"] == pytest.approx(100 / 3, abs=1e-3)
    assert b["queued_ms"] == pytest.approx((0 + 130 + 160) / 3, abs=1e-3)
    assert b["run_ms"] == 30 and b["hop_ms"] == 0


@pytest.mark.parametrize("policy", list(POLICIES))
def test_breakdown_adds_up_to_latency_of_a_chain(policy):
    # for a chain every task is sent when its predecessor ends: latency = tasks x sum
    r = one(tiny([0, 50, 2000], dags=CHAIN, gpu_mb=700), policy, hop_ms=7)
    total = sum(r["breakdown_ms"][k] for k in PARTS)
    assert 3 * total == pytest.approx(r["latency_ms"]["mean"], abs=0.01)
    assert r["breakdown_ms"]["hop_ms"] == 7


def test_hop_adds_exactly_one_hop_per_task_on_an_idle_chain():
    base = one(tiny([0, 5000], dags=CHAIN, gpu_mb=700))["latency_ms"]["mean"]
    hop = one(tiny([0, 5000], dags=CHAIN, gpu_mb=700), hop_ms=12.5)["latency_ms"]["mean"]
    assert hop - base == pytest.approx(3 * 12.5)


def test_hop_default_is_zero_and_changes_nothing():
    w = load_workload(EDGE)
    assert outcome(simulate(w, ["compass", "jsq"], jobs=80)) == \
        outcome(simulate(w, ["compass", "jsq"], jobs=80, hop_ms=0.0))


def test_plans_that_count_the_hop_predict_each_jobs_finish_without_its_bias():
    """Workers publish the hop they pay and plans add it before each start: the planned
    finish loses the hop-per-task bias it has when plans leave the hop out."""
    w = load_workload(EDGE)
    kw = {"rate": 0.5, "jobs": 200, "workers": 8, "hop_ms": 20}
    blind = one(w, plan_hop=False, **kw)["finish_error"]
    known = one(w, **kw)["finish_error"]
    assert blind["bias_median_ms"] >= 2 * 20  # two or three hops a job, unplanned
    assert abs(known["bias_median_ms"]) < 5
    assert known["rel_err_median"] < blind["rel_err_median"] / 2


def test_hop_costs_about_hops_times_hop_ms_at_low_load():
    # edge-vision's critical paths are 3, 3 and 2 tasks long (mix 0.4/0.35/0.25: 2.75)
    w = load_workload(EDGE)
    kw = {"rate": 0.5, "jobs": 200, "workers": 8}
    base = one(w, **kw)["latency_ms"]["mean"]
    with_hop = one(w, hop_ms=20, **kw)["latency_ms"]["mean"]
    assert 2.4 <= (with_hop - base) / 20 <= 3.1


def test_hop_saturates_a_loaded_cluster_more_than_linearly():
    # at high load (edge-vision's rate on 3 workers) the hop also eats worker capacity, so
    # latency grows well beyond the 2.75 hops per job that an idle cluster would add
    w = load_workload(EDGE)
    base = one(w, jobs=300, workers=3)["latency_ms"]["mean"]
    with_hop = one(w, jobs=300, workers=3, hop_ms=10)["latency_ms"]["mean"]
    assert with_hop - base > 1.3 * 2.75 * 10


def test_cli_hop_ms_and_json_fields(tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(compass_command, [
        "simulate", "--workload", str(EDGE), "--jobs", "30", "--policies", "compass,hash",
        "--hop-ms", "4", "--json", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "4 ms modelled hop per task" in result.output and "plan p50" in result.output
    for r in json.loads(out.read_text())["policies"].values():
        assert r["breakdown_ms"]["hop_ms"] == 4 and r["plan_ms"]["p50"] > 0


def test_cli_rejects_negative_hop():
    result = CliRunner().invoke(compass_command, [
        "simulate", "--workload", str(EDGE), "--hop-ms", "-1"])
    assert result.exit_code != 0 and "--hop-ms" in result.output
