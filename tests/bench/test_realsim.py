"""The sim-real criterion: pooled real mean within the pooled simulated range, loads
within 1.3x or 0.5% of the tasks; and the table command over saved runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compass_celery.bench.realsim import Rerun, judge, loads_agree, sim_range
from compass_celery.cli import compass_command


def rerun(
    real: float,
    sims: tuple[float, ...],
    loads: int = 10,
    sim_loads: tuple[int, ...] = (10, 10, 10),
    tasks: int = 800,
    jobs: int = 270,
) -> Rerun:
    return Rerun(real, sims, loads, sim_loads, tasks, jobs)


def test_a_real_mean_within_the_pooled_draws_passes():
    runs = [
        rerun(200.0, (190.0, 205.0, 198.0)),
        rerun(300.0, (290.0, 310.0, 296.0)),
        rerun(250.0, (240.0, 260.0, 255.0)),
    ]
    v = judge(runs)
    # draw k pooled with draw k: 240.0, 258.3, 249.7
    assert (v.sim_low_ms, v.sim_high_ms) == (240.0, 258.3)
    assert v.passed and v.mean_ok and v.loads_ok and v.real_mean_ms == 250.0
    assert "within" in v.reason


def test_a_real_mean_above_every_pooled_draw_fails_and_says_by_how_much():
    runs = [rerun(210.0, (190.0, 200.0, 195.0))] * 3
    v = judge(runs)
    assert not v.passed and not v.mean_ok and v.loads_ok
    assert "above the simulated 190.0-200.0 (1.050x the largest)" in v.reason
    below = judge([rerun(180.0, (190.0, 200.0, 195.0))] * 3)
    assert not below.passed and "below" in below.reason


def test_runs_weigh_by_their_jobs():
    runs = [
        rerun(100.0, (100.0,), jobs=1),
        rerun(200.0, (150.0,), jobs=3),
        rerun(200.0, (150.0,), jobs=3),
    ]
    v = judge(runs)
    assert v.real_mean_ms == pytest.approx(185.7, abs=0.05)  # (100 + 6 x 200) / 7
    assert v.sim_high_ms == pytest.approx(142.9, abs=0.05)


def test_loads_agree_within_the_factor_or_a_share_of_the_tasks():
    assert loads_agree(13, 10, 100) and loads_agree(10, 13, 100)  # 1.3x
    assert not loads_agree(14, 10, 100)  # 1.4x, 4% of the tasks
    assert loads_agree(4, 0, 1000) and loads_agree(5, 0, 1000)  # a handful: 0.5% of 1,000
    assert not loads_agree(6, 0, 1000)
    assert loads_agree(0, 0, 10)
    v = judge([rerun(200.0, (190.0, 210.0), loads=40, sim_loads=(20, 20), tasks=1000)] * 3)
    assert v.mean_ok and not v.loads_ok and not v.passed
    assert "loads 120 against 60 simulated (2.00x; 2.00% of 3000 tasks)" in v.reason


def test_pooled_loads_take_the_median_draw_of_the_sums():
    runs = [rerun(200.0, (190.0, 210.0, 200.0), loads=3, sim_loads=(0, 9, 3))] * 3
    assert judge(runs).sim_loads == 9  # sums 0, 27, 9


def test_runs_with_only_their_least_and_largest_give_a_bound_and_say_so():
    runs = [Rerun(200.0, (190.0, 205.0), 1, (1,), 800, 270, ends_only=True)] * 3
    assert sim_range(runs) == (190.0, 205.0, True)
    assert "least and largest" in judge(runs).reason


def test_fewer_than_three_reruns_are_refused():
    with pytest.raises(ValueError, match="3 or more reruns"):
        judge([rerun(200.0, (190.0, 210.0))] * 2)
    with pytest.raises(ValueError, match="simulated means"):
        judge([rerun(200.0, ())] * 3)


def _saved(real: float, sims: list[float], seed: int, scale: float = 1.0) -> dict:
    per_job = [{"i": i, "dag": "search", "latency_ms": real, "outcome": "met"} for i in range(20)]
    return {
        "workload": "edge-vision",
        "time_scale": scale,
        "seed": seed,
        "policies": {
            "compass": {"latency_ms": {"mean": real}, "loads_after_warmup": 0, "per_job": per_job}
        },
        "simulated_drawn_spread": {
            "compass": {
                "draws": len(sims),
                "draw_means_ms": sims,
                "draw_loads": [0] * len(sims),
                "mean_ms": {"min": min(sims), "median": sorted(sims)[1], "max": max(sims)},
                "loads_after_warmup": {"min": 0, "median": 0, "max": 0},
            }
        },
    }


def test_the_table_command_judges_each_workload_and_time_scale(tmp_path):
    for seed, real in ((1, 100.0), (2, 110.0), (3, 120.0)):
        (tmp_path / f"ev-1.0-s{seed}.json").write_text(
            json.dumps(_saved(real, [105.0, 112.0, 108.0], seed))
        )
        (tmp_path / f"ev-0.5-s{seed}.json").write_text(
            json.dumps(_saved(real + 40, [105.0, 112.0, 108.0], seed, 0.5))
        )
    (tmp_path / "notes.json").write_text("{}")  # not a compare-sim run: ignored
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "verdicts.json"  # not among the runs: a folder of its own
    result = CliRunner().invoke(
        compass_command, ["bench", "realsim-table", str(tmp_path), "--json", str(out)]
    )
    assert result.exit_code == 1, result.output  # one of the two fails
    lines = result.output.splitlines()
    assert any(
        ln.startswith("| edge-vision | 1 | 3 | 110.0 | 105.0-112.0 | 0 / 0 (108) | pass")
        for ln in lines
    )  # 18 search jobs after warm-up a run, 2 tasks each, 3 runs
    assert any(ln.startswith("| edge-vision | 0.5 | 3 | 150.0 |") and "FAIL" in ln for ln in lines)
    assert "1 of 2 pass." in result.output
    saved = json.loads(out.read_text())
    assert saved["verdicts"]["edge-vision@1"]["passed"] is True
    # two reruns only: nothing to judge
    for path in tmp_path.glob("ev-*-s3.json"):
        path.unlink()
    result = CliRunner().invoke(compass_command, ["bench", "realsim-table", str(tmp_path)])
    assert result.exit_code != 0 and "3 reruns or more" in result.output


def test_draws_made_elsewhere_replace_the_saved_ones(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed in (1, 2, 3):
        (runs / f"ev-s{seed}.json").write_text(json.dumps(_saved(150.0, [105.0, 112.0], seed)))
    made = {
        f"ev-s{seed}": {"late": {"draw_means_ms": [140.0, 160.0], "draw_loads": [0, 0]}}
        for seed in (1, 2, 3)
    }
    (tmp_path / "draws.json").write_text(json.dumps(made))
    args = ["bench", "realsim-table", str(runs), "--draws", str(tmp_path / "draws.json")]
    assert CliRunner().invoke(compass_command, [*args[:3]]).exit_code == 1  # as saved: fails
    result = CliRunner().invoke(compass_command, [*args, "--variant", "late"])
    assert result.exit_code == 0, result.output
    assert "| 150.0 | 140.0-160.0 |" in result.output
    missing = CliRunner().invoke(compass_command, [*args, "--variant", "other"])
    assert missing.exit_code != 0 and "no 'other' draws of ev-s1" in missing.output


def test_a_saved_run_simulated_again_with_its_delays_runs_later():
    from compass_celery.cli.compare import resimulate
    from compass_celery.workload import load_workload

    saved = json.loads(Path("docs/results/realsim/edge-vision-1.0.json").read_text())
    saved["policies"]["compass"]["jobs"] = 60  # what it measured, on fewer jobs
    workload = load_workload("dags/edge-vision.json")
    plain = resimulate(saved, workload, delays=False)["compass"]
    delayed = resimulate(saved, workload)["compass"]
    assert plain["draws"] == delayed["draws"] == 9 and len(delayed["draw_means_ms"]) == 9
    # each job's sends and answer wait their measured delays (a few ms each)
    assert delayed["mean_ms"]["median"] > plain["mean_ms"]["median"] + 3.0
