"""A real worker publishes the demand it served, and the router's view sums it.

The worker runs at ``time_scale`` 0.05, so the tracker's 10 s minimum age and 30 s time
constant (workload time) pass in 0.5 and 1.5 real seconds: the test takes seconds, and
the rates outlive the checks (they decay below the published minimum in ~10 s).
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from compass_celery.local import wait_until
from compass_celery.state import keys
from compass_celery.state.views import cluster_view
from compass_celery.testing import worker_logs
from workers.emulated import make_app

pytestmark = pytest.mark.redis


def test_a_workers_record_carries_served_demand_and_the_router_sees_it(
        compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_HEARTBEAT_TIMEOUT_S": "3"}
    w = compass_workers("workers.emulated", "cap@test", "--compass-emulate-gpu-mb", "1600",
                        "--compass-preload", "captioner", "--compass-time-scale", "0.05",
                        env=env)
    app = make_app(compass_redis_url, compass_heartbeat_timeout_s=3, compass_snapshot_ttl_s=0)
    store, timeout = app.compass.store, app.compass.settings["heartbeat_timeout_s"]

    def live():
        snap = store.snapshot(time.time(), timeout)
        return snap if snap.workers else None

    try:
        first = wait_until(live, 30, "the worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    assert first.workers[0].served == {}  # nothing served yet: no field, no demand
    caption = app.tasks["emulated.caption"]
    results = [caption.delay(i) for i in range(20)]
    assert {r.get(timeout=20)["worker"] for r in results} == {"cap@test"}, worker_logs([w])

    def served():
        snap = store.snapshot(time.time(), timeout)
        return snap if snap.workers and snap.workers[0].served else None

    try:
        snap = wait_until(served, 10, "served demand in the worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    rates = snap.workers[0].served
    assert set(rates) == {"captioner"}
    # 20 tasks of ~120 workload ms each: a positive, finite rate of both kinds
    assert rates["captioner"].per_s > 0 and rates["captioner"].ms_per_s > 0
    client = redis.Redis.from_url(compass_redis_url)
    raw = client.hget(keys.key(keys.WORKERS, "compass"), "cap@test")
    assert "captioner" in json.loads(raw)["served"]  # it is in the published bytes
    # the router's reader and view: the cluster's demand is the worker's served rates
    reader_snap = app.compass.reader.get()
    view = cluster_view(reader_snap, app.compass.model_sizes())
    assert "captioner" in view.demand, (reader_snap.workers, view.demand)
    assert view.demand["captioner"].per_s > 0
    assert "eviction order not refreshed" not in w.log()
