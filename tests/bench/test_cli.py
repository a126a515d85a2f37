"""The compass-celery command line: bench, simulate, status, and their errors."""

from __future__ import annotations

import json
import os

import pytest
import redis
from click.testing import CliRunner

from compass_celery import workloads
from compass_celery.cli import compass_command

RESULT_FIELDS = {"jobs", "completed", "failed", "lost", "latency_ms", "cache_hit_rate",
                 "model_loads", "throughput_jobs_per_s"}


def run(*args: str) -> object:
    return CliRunner().invoke(compass_command, list(args), catch_exceptions=False)


def test_malformed_workload_names_the_field(tmp_path):
    bad = json.loads(workloads.path("edge-vision.json").read_text())
    bad["dags"]["document"]["nodes"]["ocr"]["exec_ms"] = "fast"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    for command in ("bench", "simulate"):
        result = run(command, "--workload", str(path))
        assert result.exit_code != 0
        assert "dags.document.nodes.ocr.exec_ms" in result.output


def test_seed_draws_other_arrivals_and_is_recorded(tmp_path):
    def mean(seed: str | None) -> tuple[int, float]:
        out = tmp_path / f"sim-{seed}.json"
        args = ["simulate", "--workload", "edge-vision", "--jobs", "40", "--policies",
                "compass", "--json", str(out)]
        result = run(*args, *(["--seed", seed] if seed else []))
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        return data["seed"], data["policies"]["compass"]["latency_ms"]["mean"]

    default_seed, default_mean = mean(None)
    assert mean(None) == (default_seed, default_mean)  # the workload's own seed: same run
    seed, other = mean(str(default_seed + 1))
    assert seed == default_seed + 1 and other != default_mean


def test_missing_workload_file_is_a_clear_error(tmp_path):
    result = run("simulate", "--workload", str(tmp_path / "nope.json"))
    assert result.exit_code != 0 and "nope.json" in result.output


def test_unknown_policy_is_rejected():
    result = run("simulate", "--workload", str(workloads.path("edge-vision.json")),
                 "--policies", "compass,fastest")
    assert result.exit_code != 0 and "unknown policy 'fastest'" in result.output


def test_unreachable_redis_is_a_clear_error():
    result = run("bench", "--workload", str(workloads.path("edge-vision.json")), "--redis",
                 "redis://127.0.0.1:1/0", "--jobs", "2")
    assert result.exit_code != 0 and "cannot reach Redis at redis://127.0.0.1:1/0" in \
        result.output


def test_simulate_writes_the_design_json(tmp_path):
    out = tmp_path / "sim.json"
    result = run("simulate", "--workload", str(workloads.path("edge-vision.json")), "--jobs", "60",
                 "--policies", "celery-default,compass", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["workload"] == "edge-vision"
    for name in ("celery-default", "compass"):
        assert set(data["policies"][name]) >= RESULT_FIELDS
        assert data["policies"][name]["jobs"] == 60 and data["policies"][name]["lost"] == 0


@pytest.mark.redis
def test_bench_runs_a_real_cluster_and_loses_nothing(compass_redis_url, tmp_path):
    out = tmp_path / "bench.json"
    result = run("bench", "--workload", str(workloads.path("edge-vision.json")), "--redis",
                 compass_redis_url, "--policies", "celery-default,compass", "--jobs", "16",
                 "--time-scale", "0.3", "--json", str(out), "--quiet", "--compare-sim")
    assert result.exit_code == 0, result.output
    assert "emulated GPU timings" in result.output
    assert "real cluster against the simulator" in result.output
    data = json.loads(out.read_text())
    # the busy workers' hops, kept, and drawn task by task in a third simulation
    assert "drawn task by task" in result.output
    assert all(data["policies"][name]["hop_gaps_ms"] for name in ("celery-default", "compass"))
    for name in ("celery-default", "compass"):  # the same jobs, simulated, side by side
        assert data["simulated_drawn"][name]["jobs"] == 16
        assert data["real_over_sim_drawn"][name]["sim_mean"] > 0
        # the drawn simulation is the median of several draws, their range printed
        drawn = data["simulated_drawn_spread"][name]
        assert drawn["draws"] == 9 and "run" not in drawn
        assert drawn["mean_ms"]["median"] == data["simulated_drawn"][name]["latency_ms"]["mean"]
        assert f"{name}: simulated mean {drawn['mean_ms']['min']:.1f} to " in result.output
        gap = data["real_over_sim"][name]
        assert data["simulated"][name]["jobs"] == 16 and gap["sim_mean"] > 0
        assert gap["mean"] == pytest.approx(gap["real_mean"] / gap["sim_mean"])
        # loads after warm-up, real and simulated, as shares of the same tasks
        real = data["policies"][name]
        assert 0 <= real["loads_after_warmup"] <= real["model_loads"]
        assert gap["real_load_fraction"] == real["load_fraction"]
        assert gap["sim_load_fraction"] == data["simulated"][name]["load_fraction"]
    assert data["emulated_gpu"] is True and data["time_scale"] == 0.3
    for name in ("celery-default", "compass"):
        r = data["policies"][name]
        assert set(r) >= RESULT_FIELDS
        assert (r["jobs"], r["completed"], r["failed"], r["lost"]) == (16, 16, 0, 0)
        assert r["latency_ms"]["p50"] > 0 and r["model_loads"] > 0
        assert set(r["breakdown_ms"]) == {"queued_ms", "load_ms", "run_ms"}
        if os.path.exists("/proc/stat"):  # how busy the host was, and who kept it busy
            host = r["host"]
            assert host["samples"] > 0 and 0 <= host["busy_median"] <= 1
            assert host["cpu_s"]["workers"] > 0 and host["cpu_s"]["producer"] > 0
            assert "redis" not in host["cpu_s"]  # a Redis it was given is not the rig's
            assert host["cpu_ms_per_task"]["workers"] == pytest.approx(
                1000 * host["cpu_s"]["workers"] / r["executions"], rel=0.01, abs=0.01)
            # compass's own handlers: a part of what the workers spent
            assert 0 < host["compass_handlers_ms_per_task"] < host["cpu_ms_per_task"]["workers"]
    if os.path.exists("/proc/stat"):
        assert "host: " in result.output and "CPU a task: workers" in result.output


@pytest.mark.redis
def test_status_lists_workers_and_skips_garbage(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    client.hset("{compass}:workers", "junk@x", b"not json")
    result = run("status", "--redis", compass_redis_url)
    assert result.exit_code == 0, result.output
    assert "0 live compass worker(s)" in result.output
    assert "junk@x" in result.output and "not valid JSON" in result.output


@pytest.mark.parametrize("fault", [["--pause-redis-after", "3"], ["--restart-redis-after", "3"],
                                   ["--redis-aof"]])
def test_redis_broker_faults_do_not_apply_over_amqp(fault):
    result = run("bench", "--workload", str(workloads.path("edge-vision.json")), "--broker",
                 "amqp://guest:guest@127.0.0.1:5672/x", *fault)
    assert result.exit_code != 0 and "does not apply over AMQP" in result.output


def test_broker_takes_an_amqp_url():
    result = run("bench", "--workload", str(workloads.path("edge-vision.json")), "--broker",
                 "redis://127.0.0.1:6379/0")
    assert result.exit_code != 0 and "amqp://" in result.output


def test_the_held_slot_flag_is_for_emulated_workers():
    result = run("bench", "--workload", str(workloads.path("edge-vision.json")), "--real",
                 "--hold-max-ms", "1000")
    assert result.exit_code != 0 and "--hold-max-ms" in result.output


def test_simulate_takes_the_static_replica_reference_but_bench_does_not(tmp_path):
    out = tmp_path / "sim.json"
    result = run("simulate", "--workload", str(workloads.path("multi-model.json")), "--jobs",
                 "40", "--policies", "compass,static-replicas", "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())["policies"]
    assert data["static-replicas"]["jobs"] == 40 and data["static-replicas"]["lost"] == 0
    assert data["static-replicas"]["assignment"]  # which workers hold which models
    refused = run("bench", "--workload", str(workloads.path("multi-model.json")),
                  "--policies", "static-replicas")
    assert refused.exit_code != 0 and "unknown policy 'static-replicas'" in refused.output


def test_the_held_slot_is_the_settings_default_unless_the_flag_sets_it():
    """Without --hold-max-ms the bench sets nothing: its emulated workers and its producer
    both take the setting's default (off); with it, both take the flag's value."""
    from compass_celery.bench.runner import _bench_app
    from compass_celery.cli.cluster import ClusterArgs, bench_options, cluster
    from compass_celery.settings import OPTIONS
    from compass_celery.workload import load_workload

    path = str(workloads.path("navigator-mixed.json"))
    w = load_workload(path)
    url = "redis://127.0.0.1:1/0"  # never reached: the app is only configured
    seen = {}
    for flag in ([], ["--hold-max-ms", "1000"]):
        ctx = cluster.make_context("cluster", ["--workload", path, *flag])
        opts = bench_options(ClusterArgs(**ctx.params))
        app = _bench_app(w, "compass", "pfx", url, url, opts, ["w0"])
        seen[tuple(flag)] = (opts.extra_env.get("COMPASS_HOLD_MAX_MS"),
                             app.compass.settings.hold_max_ms)
    assert seen[()] == (None, OPTIONS["hold_max_ms"].default)
    assert seen[("--hold-max-ms", "1000")] == ("1000.0", 1000.0)
