"""Two apps on one Redis, each with its own key prefix, share nothing."""

from __future__ import annotations

import time

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, executions, wait_live
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis


def test_two_apps_on_one_redis_are_isolated(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1"}
    wa = compass_workers("tests.support.jobapp", "w@appa", *GPU,
                         env={**env, "COMPASS_JOBAPP_KEY_PREFIX": "appa"})
    wb = compass_workers("tests.support.jobapp", "w@appb", *GPU,
                         env={**env, "COMPASS_JOBAPP_KEY_PREFIX": "appb"})
    a = make_app(compass_redis_url, compass_key_prefix="appa", compass_snapshot_ttl_s=0.0)
    b = make_app(compass_redis_url, compass_key_prefix="appb", compass_snapshot_ttl_s=0.0)
    wait_live(a, 1, [wa])
    wait_live(b, 1, [wb])
    assert a.compass.shared_queue == "appa.shared" and b.compass.queue_for("x") == "appb.w.x"
    ra = [a.tasks["j.heavy"].delay(i) for i in range(4)]
    rb = [b.tasks["j.heavy"].delay(10 + i) for i in range(4)]
    dag = Dag(b, "b-only")
    s = dag.node("s", b.tasks["j.src"].s(1))
    dag.node("t", b.tasks["j.add"].s(2), after=[s])
    assert dag.apply_async().get(timeout=30) == {"t": 3}
    assert sorted(r.get(timeout=30) for r in ra) == [0, 1, 2, 3], worker_logs([wa, wb])
    assert sorted(r.get(timeout=30) for r in rb) == [10, 11, 12, 13]
    assert [w.name for w in a.compass.store.snapshot(time.time(), 1.0).workers] == ["w@appa"]
    assert [w.name for w in b.compass.store.snapshot(time.time(), 1.0).workers] == ["w@appb"]
    import redis

    log = redis.Redis.from_url(compass_redis_url)
    runs = executions(type("App", (), {"log": log}))
    assert set(runs.values()) == {1}
    for r in ra:  # each app's tasks ran on its own worker only
        assert "w@appa" in wa.log() and r.id in wa.log() and r.id not in wb.log()
    for r in rb:
        assert r.id in wb.log() and r.id not in wa.log()
    assert not log.exists("appa:dead-letter") and not log.exists("appb:dead-letter")
