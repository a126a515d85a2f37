"""Batched tasks through the benchmark's machinery on real Redis-backed workers: the
workload's batchable node runs as one task that workers batch; with batching on, passes
hold many inputs, with it off every pass holds one; every job ends, none is lost."""

from __future__ import annotations

import pytest

from compass_celery.bench.batching import VARIANTS, options_for, run_summary, sustained, warm
from compass_celery.bench.options import BenchOptions
from compass_celery.bench.runner import run_policy
from compass_celery.emulated import batched_tasks
from compass_celery.workload import load_workload

pytestmark = pytest.mark.redis

#: Two emulated GPUs at twice the workload's run times, sent 300 jobs/s: far more than
#: they run one at a time (about 50/s), so inputs queue up behind every pass.
BASE = BenchOptions(jobs=60, time_scale=2.0, workers=2, progress=False, warmup_frac=0.0,
                    drain_timeout_s=60.0)


def _run(url: str, variant: str, tmp_path) -> dict:
    workload = load_workload("dags/batch-embed.json")
    opts = options_for(warm(BASE, workload), variant, 300.0)
    opts.log_dir = str(tmp_path)
    return run_policy(workload, opts.policies[0], url, opts, lambda _: None)


def test_the_batchable_node_of_both_templates_runs_one_batched_task():
    tasks, nodes = batched_tasks(load_workload("dags/batch-embed.json").dags, "emulated")
    assert list(tasks) == ["emulated.batched.embed"]
    assert nodes == {("embed", "embed"): "emulated.batched.embed",
                     ("search", "embed"): "emulated.batched.embed"}
    assert tasks["emulated.batched.embed"]["batch"] == {
        "max_size": 32, "max_wait_ms": 5.0, "base_ms": 18.9, "per_item_ms": 4.83}


def test_variants_map_to_the_two_settings():
    assert {v: options_for(BASE, v, 10.0) for v in VARIANTS}["compass+blind"].batch_aware \
        is False
    off = options_for(BASE, "compass", 10.0)
    assert (off.batching, off.admission, off.rate) == (False, False, 10.0)
    assert options_for(BASE, "compass+batch", 10.0, admission=True).admission is True
    assert warm(BASE, load_workload("dags/batch-embed.json")).extra_env == {
        "COMPASS_PRELOAD": "bert-base"}
    assert sustained({"10": {"p99": 5}, "20": {"p99": 50}, "30": {"p99": 8}}, 10) == 10


def test_workers_batch_a_queued_up_stream_and_lose_nothing(compass_redis_url, tmp_path):
    r = _run(compass_redis_url, "compass+batch", tmp_path)
    run = run_summary(r)
    assert (run["completed"], run["failed"], run["lost"], run["stranded"]) == (60, 0, 0, 0), run
    assert r["duplicates"] == 0
    b = r["batching"]
    assert b["inputs"] == 60  # one input per job's embed node, each in exactly one pass
    assert b["size"]["max"] > 1 and b["passes"] < 60, b


def test_without_batching_every_pass_holds_one_input(compass_redis_url, tmp_path):
    r = _run(compass_redis_url, "compass", tmp_path)
    run = run_summary(r)
    assert (run["completed"], run["lost"], run["stranded"]) == (60, 0, 0), run
    b = r["batching"]
    assert b["passes"] == b["inputs"] == 60 and b["size"]["max"] == 1, b
