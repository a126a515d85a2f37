"""Redis-backed placement with a real redis-server and real worker processes."""

from __future__ import annotations

import json
import logging
import time

import pytest
import redis

from compass_celery.local import RedisServer, wait_until
from compass_celery.placement import PlacementError
from compass_celery.testing import worker_logs
from workers.emulated import make_app

pytestmark = pytest.mark.redis

GPU = ["--compass-emulate-gpu-mb", "1600"]


def live_workers(app, n: int, timeout: float = 30.0, workers=()):
    store = app.compass.store

    def ready():
        snap = store.snapshot(time.time(), app.compass.settings["heartbeat_timeout_s"])
        return snap if len(snap.workers) == n else None

    try:
        return wait_until(ready, timeout, f"{n} live compass workers")
    except TimeoutError:
        raise AssertionError(worker_logs(list(workers))) from None


@pytest.fixture
def two_workers(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_HEARTBEAT_TIMEOUT_S": "1.5"}
    ws = [compass_workers("workers.emulated", "cap@test", *GPU, "--compass-preload",
                          "captioner", env=env),
          compass_workers("workers.emulated", "det@test", *GPU, "--compass-preload",
                          "detector,translator", env=env)]
    app = make_app(compass_redis_url, compass_heartbeat_timeout_s=1.5, compass_snapshot_ttl_s=0)
    live_workers(app, 2, workers=ws)
    return app, ws


def test_task_lands_on_worker_holding_its_model(two_workers):
    app, ws = two_workers
    caption, detect = app.tasks["emulated.caption"], app.tasks["emulated.detect"]
    res_c, res_d = caption.delay("img-1"), detect.delay("img-2")
    assert res_c.get(timeout=20)["worker"] == "cap@test", worker_logs(ws)
    assert res_d.get(timeout=20)["worker"] == "det@test"
    placed = app.compass.placement(res_c.id)
    assert placed.worker == "cap@test" and placed.load_ms == 0
    assert "resident" in placed.reason
    # a task without compass options routes exactly as plain Celery would
    assert app.tasks["emulated.plain"].delay(21).get(timeout=20) == 42


def test_busy_worker_loses_once_backlog_outweighs_load_time(two_workers):
    app, _ = two_workers
    caption = app.tasks["emulated.caption"]
    # captioner: 950 MB at 1500 MB/s = 633 ms to load on det@test; run 120 ms.
    results = [caption.delay(i) for i in range(10)]
    placements = [app.compass.placement(r.id) for r in results]
    workers = [p.worker for p in placements]
    # while the backlog on cap@test (0, 120, ... 600 ms) is below the load time,
    # the worker holding the model keeps winning ...
    assert workers[:6] == ["cap@test"] * 6
    # (less what the task running there has done by then: only its remaining part waits)
    waits = [p.wait_ms for p in placements[:6]]
    for wait, whole in zip(waits, [0, 120, 240, 360, 480, 600], strict=True):
        assert whole - 120 <= wait <= whole, waits
    assert waits == sorted(waits), waits
    # ... and once the wait (720 ms) outweighs the load time, the idle worker wins
    assert workers[6] == "det@test"
    # learned from cap@test's preload of the same model: the 633 ms sleep plus a little
    assert placements[6].load_ms == pytest.approx(633.3, rel=0.03)
    ran = [r.get(timeout=30)["worker"] for r in results]
    assert ran == workers


def test_killed_worker_stops_being_chosen(two_workers):
    app, ws = two_workers
    ws[0].kill()  # SIGKILL: no clean shutdown, its record stays behind
    # its last beat ages past the 1.5 s heartbeat timeout: from then on it is not live
    wait_until(lambda: [w.name for w in app.compass.store.snapshot(time.time(), 1.5).workers]
               == ["det@test"], 10, "only det@test live")
    res = app.tasks["emulated.caption"].delay("after-kill")
    assert app.compass.placement(res.id).worker == "det@test"
    assert res.get(timeout=20)["worker"] == "det@test"


def test_garbled_worker_record_is_skipped_and_named(two_workers, caplog):
    app, _ = two_workers
    client = redis.Redis.from_url(app.conf.broker_url)
    client.hset("{compass}:workers", "evil@test", b"{not json")
    client.hset("{compass}:workers", "half@test", json.dumps({"name": "half@test",
                                                            "queue": "q"}))
    with caplog.at_level(logging.WARNING, logger="compass_celery.state"):
        res = app.tasks["emulated.detect"].delay("x")
        assert res.get(timeout=20)["worker"] == "det@test"
    text = caplog.text
    assert "evil@test" in text and "not valid JSON" in text
    assert "half@test" in text and "gpu_total_mb" in text


def test_unknown_model_and_bad_runtime_are_clear_errors(two_workers):
    app, _ = two_workers
    infer = app.tasks["emulated.infer"]
    with pytest.raises(PlacementError, match="unknown model 'nosuchmodel'"):
        infer.apply_async(("nosuchmodel", 10), compass={"model": "nosuchmodel"})
    with pytest.raises(ValueError, match="exec_ms must be >= 0"):
        infer.apply_async(("detector", -5), compass={"model": "detector", "exec_ms": -5})
    # the call option form works and the worker is still fine afterwards
    res = infer.apply_async(("detector", 5), compass={"model": "detector", "exec_ms": 5})
    assert res.get(timeout=20)["worker"] == "det@test"


def test_state_redis_outage_falls_back_to_shared_queue(compass_redis_url, compass_workers,
                                                       caplog):
    with RedisServer() as state:
        env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_REDIS_URL": state.url}
        w = compass_workers("workers.emulated", "solo@test", *GPU, env=env)
        app = make_app(compass_redis_url, state_url=state.url, compass_snapshot_ttl_s=0)
        live_workers(app, 1, workers=[w])
        state.stop()  # the state store goes away; the broker stays
        with caplog.at_level(logging.WARNING, logger="compass_celery.router"):
            results = [app.tasks["emulated.detect"].delay(i) for i in range(3)]
        decisions = [app.compass.placement(r.id) for r in results]
        assert all(d.fallback and d.queue == "compass.shared" for d in decisions)
        assert caplog.text.count("routing to shared queue") == 1
        assert [r.get(timeout=30)["worker"] for r in results] == ["solo@test"] * 3


def test_a_decision_header_is_every_field_as_a_plain_value_and_reads_back():
    from dataclasses import asdict, fields

    from compass_celery.placement import Decision

    d = Decision(task="t", model="m", worker="w", queue="q", policy="compass", charge_ms=12.5,
                 est_finish_ms=40.0, wait_ms=3.0, load_ms=20.0, run_ms=10.0, reason="r",
                 fallback=False, priority=7, queued_at=1.5, slo="gold", due=9.0,
                 expires_at=8.0, late=True, batch="k")
    header = d.as_header()
    assert header == asdict(d) and set(header) == {f.name for f in fields(Decision)}
    # a shallow copy is whole only while every field is a plain value
    assert all(isinstance(v, (str, int, float, bool, type(None))) for v in header.values())
    assert Decision.from_header(header) == d
