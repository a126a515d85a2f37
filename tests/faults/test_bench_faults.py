"""The benchmark's fault flags and its delivery counts: duplicates and stranded."""

from __future__ import annotations

import json
import os

import pytest
import redis
from click.testing import CliRunner

from compass_celery import workloads
from compass_celery.bench.runner import stranded_messages
from compass_celery.broker.kombu_redis import RedisLayout
from compass_celery.cli import compass_command
from compass_celery.results import duplicate_count, duplicated_ids


def run(*args: str) -> object:
    return CliRunner().invoke(compass_command, list(args), catch_exceptions=False)


def test_duplicates_count_executions_beyond_the_first():
    counts = {"a": 1, "b": 3, "c": 2}
    assert duplicate_count(counts) == 3
    assert duplicated_ids(counts) == ["b", "c"]
    assert duplicate_count({}) == 0


@pytest.mark.parametrize("flag", ["--pause-redis-after", "--restart-redis-after"])
def test_redis_faults_need_the_private_redis(flag):
    result = run("bench", "cluster", "--workload", str(workloads.path("edge-vision.json")),
                 "--redis", "redis://127.0.0.1:1/0", flag, "3")
    assert result.exit_code != 0 and f"{flag} needs the bench's private Redis" in result.output


def test_fault_flags_are_documented():
    text = run("bench", "cluster", "--help").output
    for flag in ("--rolling-restart-after", "--pause-redis-after", "--pause-redis-for",
                 "--skew-clock-s", "--long-task-s", "--restart-redis-after", "--redis-aof",
                 "--kill-worker-after", "--kill-restart"):
        assert flag in text


@pytest.mark.redis
def test_stranded_counts_every_place_a_message_can_wait(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    layout = RedisLayout()
    p = "compass-bench-compass"
    client.lpush(f"{p}.w.w0@compass", "m1", "m2")                    # a worker queue
    client.lpush(layout.list_for(f"{p}.w.w1@compass", 9), "m3")      # a priority list
    client.lpush(f"{p}.w.gone@compass", "m4")                         # a worker not in the run
    client.lpush(f"{p}.shared", "m5")                                 # the shared queue
    client.lpush(f"{p}:staging:{p}.w.w0@compass", "m6")               # a staging list
    client.lpush(layout.bell(f"{p}.w.w0@compass"), "1")               # a wake-up, no message
    client.hset("unacked", "t1", json.dumps([{"m": 1}, "", f"{p}.w.w1@compass"]))
    client.hset("unacked", "t2", json.dumps([{"m": 1}, "", "compass-bench-jsq.shared"]))
    client.lpush("compass-bench-jsq.shared", "other run")             # another policy's
    where = stranded_messages(client, p, ["w0@compass", "w1@compass"])
    assert sum(where.values()) == 7
    assert where["unacked"] == 1 and where[f"{p}.w.w0@compass"] == 2
    assert where[f"{p}.w.w1@compass/9"] == 1


@pytest.mark.redis
def test_rolling_restart_loses_strands_and_repeats_nothing(tmp_path):
    """A deploy under load: every worker warm-stopped and started again by name."""
    out = tmp_path / "bench.json"
    result = run("bench", "cluster", "--workload", str(workloads.path("edge-vision.json")),
                 "--policies", "compass", "--workers", "2", "--jobs", "30", "--rate", "1.5",
                 "--time-scale", "0.5", "--rolling-restart-after", "1", "--json", str(out),
                 "--quiet")
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())["policies"]["compass"]
    restarts = [f for f in r["faults"] if f["fault"] == "rolling-restart"]
    assert [f["exit_code"] for f in restarts] == [0, 0], restarts
    assert all("live_at_s" in f for f in restarts), restarts
    assert (r["jobs"], r["completed"], r["failed"], r["lost"]) == (30, 30, 0, 0)
    assert r["stranded"] == 0, r["stranded_where"]
    assert r["duplicates"] == 0, r["duplicated_task_ids"]
    assert r["executions"] >= 30  # the ledger saw every task (edge-vision DAGs have 3+)
    if os.path.exists("/proc/stat"):  # its private Redis is the rig's: counted by name
        # the ledger's few writes may round to 0.00 s of CPU (/proc counts 10 ms ticks)
        assert r["host"]["cpu_s"]["redis"] > 0 and "ledger" in r["host"]["cpu_s"]


def test_fault_table_prints_the_measured_counts():
    from compass_celery.bench.suite import fault_table

    r = {"jobs": 400, "completed": 398, "failed": 1, "lost": 1, "duplicates": 2,
         "stranded": 3, "latency_ms": {"p99": 1234.4}}
    table = fault_table({"kill-worker": {"policies": {"compass": r}}, "unknown": {}})
    rows = table.splitlines()
    assert len(rows) == 3
    assert rows[2] == ("| SIGKILL one worker at 10 s | **compass** | 400 | 398 | 1 | 1 | 2 | 3 "
                       "| 1234 |")
