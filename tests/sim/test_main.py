"""``compass-celery sim run`` (and ``sim``, ``simulate``): writes the result JSON, rejects a
bad workload by field, compares counting pending work."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from compass_celery.cli import compass_command

DAGS = Path(__file__).resolve().parents[2] / "dags"


def sim(*args: str) -> object:
    return CliRunner().invoke(compass_command, ["sim", *args])


def test_writes_json(tmp_path):
    out = tmp_path / "r.json"
    result = sim("run", "--workload", str(DAGS / "vision-fanout.json"), "--policies",
                 "compass,jsq", "--jobs", "40", "--workers", "8", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["workload"] == "vision-fanout" and set(data["policies"]) == {"compass", "jsq"}
    assert data["policies"]["compass"]["completed"] == 40


def test_sim_and_simulate_run_the_same_command(tmp_path):
    outs = []
    for i, command in enumerate((["sim"], ["simulate"], ["sim", "run"])):
        out = tmp_path / f"{i}.json"
        result = CliRunner().invoke(compass_command, [
            *command, "--workload", "edge-vision", "--jobs", "30", "--policies", "compass",
            "--json", str(out)])
        assert result.exit_code == 0, result.output
        outs.append(json.loads(out.read_text())["policies"]["compass"]["latency_ms"])
    assert outs[0] == outs[1] == outs[2]


def test_bad_workload_names_field(tmp_path):
    bad = json.loads((DAGS / "vision-fanout.json").read_text())
    bad["arrivals"]["rate_per_s"] = "fast"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = sim("run", "--workload", str(path))
    assert result.exit_code == 1
    assert "arrivals.rate_per_s: expected a number" in result.output


def test_compare_pending(tmp_path):
    out = tmp_path / "p.json"
    result = sim("run", "--workload", str(DAGS / "caption-translate.json"), "--jobs", "30",
                 "--compare-pending", "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "count pending on" in result.output and "count pending off" in result.output
    assert set(json.loads(out.read_text())["count_pending"]) == {"on", "off"}
    refused = sim("run", "--workload", str(DAGS / "caption-translate.json"),
                  "--compare-pending", "--batching", "off")
    assert refused.exit_code == 2 and "--batching" in refused.output


def test_the_flags_reach_the_simulation(tmp_path):
    """Each modelled flag changes the run as its SimOptions field does."""
    from compass_celery.sim import SimOptions, simulate
    from compass_celery.workload import load_workload

    out = tmp_path / "r.json"
    args = ["--jobs", "40", "--hop-ms", "5", "--hop-unplanned", "--no-demand",
            "--refresh-ms", "20", "--move-factor", "3"]
    result = sim("run", "--workload", str(DAGS / "edge-vision.json"), "--policies", "compass",
                 "--json", str(out), *args)
    assert result.exit_code == 0, result.output
    direct = simulate(load_workload(DAGS / "edge-vision.json"), ["compass"],
                      SimOptions(jobs=40, hop_ms=5.0, plan_hop=False, demand=False,
                                 refresh_ms=20.0, move_factor=3.0))
    got = json.loads(out.read_text())["policies"]["compass"]
    assert got["latency_ms"] == direct["policies"]["compass"]["latency_ms"]
    default = simulate(load_workload(DAGS / "edge-vision.json"), ["compass"], jobs=40)
    assert got["latency_ms"] != default["policies"]["compass"]["latency_ms"]
