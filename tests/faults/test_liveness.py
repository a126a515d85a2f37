"""Liveness with real processes: judged on Redis's clock, never on two hosts' clocks."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from compass_celery.bench import clockskew
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import executions, start

pytestmark = pytest.mark.redis
SKEW_DIR = str(Path(clockskew.__file__).parent)


def test_a_worker_30s_ahead_neither_dies_nor_kills(compass_redis_url, compass_workers):
    skew = {"PYTHONPATH": os.pathsep.join([SKEW_DIR, os.environ.get("PYTHONPATH", "")]),
            "COMPASS_CLOCK_SKEW_S": "30"}
    app, ws = start(compass_redis_url, compass_workers, ["c0@skew", "c1@skew"],
                    per_worker_env={"c1@skew": skew})
    # a negative check (nobody is judged dead): several heartbeat timeouts (1 s) with one
    # clock 30 s ahead, the window in which a wrong judgement would happen
    time.sleep(2.5)
    results = [app.tasks["j.heavy"].delay(i) for i in range(10)]
    assert sorted(r.get(timeout=40) for r in results) == list(range(10)), worker_logs(ws)
    assert len(app.compass.store.snapshot(time.time(), 1.0).workers) == 2
    assert set(executions(app).values()) == {1}
    for w in ws:
        assert "is dead" not in w.log(), worker_logs(ws)


def test_redis_paused_for_twice_the_timeout_kills_nobody(compass_redis_server,
                                                          compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["p0@pause", "p1@pause"])
    # a negative check's window (nobody is judged dead): over a heartbeat timeout (1 s),
    # so every worker has judged its peers at least once before the pause
    time.sleep(1.5)
    results = [app.tasks["j.heavy"].delay(i) for i in range(10)]
    wait_until(lambda: executions(app), 10, "the first task to start")
    os.kill(compass_redis_server.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)  # the outage's length, the test's subject: > 2x the 1 s timeout
    finally:
        os.kill(compass_redis_server.proc.pid, signal.SIGCONT)
    assert sorted(r.get(timeout=60) for r in results) == list(range(10)), worker_logs(ws)
    assert set(executions(app).values()) == {1}, executions(app)
    for w in ws:
        assert "is dead" not in w.log(), worker_logs(ws)


def test_a_forged_record_never_makes_recovery_drain_a_foreign_queue(compass_redis_url,
                                                                    compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["f0@forge"])
    client = app.log
    client.lpush("other-app", "somebody else's message")
    forged = {"name": "evil@x", "queue": "other-app", "device": "cpu", "gpu_total_mb": 1.0,
              "gpu_free_mb": 1.0, "speed": 1.0, "load_mb_per_s": 1.0,
              "host_load_mb_per_s": 1.0, "net_mb_per_s": 1.0, "heartbeat": 0.0}
    client.hset("{compass}:workers", "evil@x", json.dumps(forged))
    client.zadd("{compass}:beats", {"evil@x": 0})  # a very stale beat: "dead"
    wait_until(lambda: "names queue 'other-app'" in ws[0].log(), 10, "the forged record's log")
    time.sleep(1.0)  # a negative check: several recovery rounds, none may drain it
    assert client.lrange("other-app", 0, -1) == [b"somebody else's message"]
    assert not client.zscore("{compass}:dead-queues", "other-app")
    assert "evil@x" not in {w.name for w in app.compass.store.snapshot(time.time(),
                                                                       1.0).workers}
    assert app.tasks["j.src"].delay(7).get(timeout=20) == 7  # the worker keeps going
