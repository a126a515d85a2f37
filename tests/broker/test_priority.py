"""``priority=`` on both brokers, with real workers: higher is more urgent, everywhere.

The flood scenario: two workers busy with a flood of batch tasks, then a few
interactive tasks (and a Dag job) sent with a high priority. They must wait only
for the batch task in flight on their worker, not behind the whole flood; and the
flood itself still completes.
"""

from __future__ import annotations

import time

import pytest

from compass_celery import Dag
from compass_celery.emulated import make_app
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs

pytest_plugins = ["tests.support.amqp_fixtures"]  # amqp_vhost_url, amqp_url
pytestmark = pytest.mark.redis

GPU = ["--compass-emulate-gpu-mb", "1600", "--compass-preload", "captioner"]
BATCH, BATCH_MS = 12, 1000.0
URGENT, URGENT_MS = 3, 50.0
#: run time + the longest batch task in flight, with a generous margin for a busy machine
#: (behind the flood they would wait ~ BATCH * BATCH_MS / 2 = 6 s)
BOUND_S = (URGENT_MS + BATCH_MS) / 1000 + 1.5


def _cluster(broker: str, state: str, compass_workers, names: list[str]):
    env = {"COMPASS_BROKER_URL": broker, "COMPASS_REDIS_URL": state,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0"}
    ws = [compass_workers("compass_celery.emulated_app", n, *GPU, env=env) for n in names]
    app = make_app(broker, state_url=state, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers)
                   == len(names), 40, f"{len(names)} live workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    return app, ws


def _infer(app, exec_ms: float, i: int, **options):
    return app.tasks["emulated.infer"].apply_async(
        ("captioner", exec_ms, i), compass={"model": "captioner", "exec_ms": exec_ms},
        **options)


def _urgent_dag(app) -> Dag:
    dag = Dag(app, "urgent")
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    a = dag.node("a", infer.s("captioner", URGENT_MS, 0), model="captioner",
                 exec_ms=URGENT_MS)
    dag.node("b", step.s("captioner", URGENT_MS), after=[a], model="captioner",
             exec_ms=URGENT_MS)
    return dag


def _flood(app, ws) -> None:
    """Flood both workers with batch work, then send urgent work; check who waited."""
    batch = [_infer(app, BATCH_MS, i, priority="batch" if i % 2 else None)
             for i in range(BATCH)]
    time.sleep(0.5)  # the flood is queued and running
    t0 = time.monotonic()
    urgent = [_infer(app, URGENT_MS, 100 + i, priority=9) for i in range(URGENT)]
    named = _infer(app, URGENT_MS, 200, priority="interactive")
    job = _urgent_dag(app).apply_async(priority=9)
    latencies = []
    for r in [*urgent, named]:
        r.get(timeout=60)
        latencies.append(time.monotonic() - t0)
    job.get(timeout=60)
    latencies.append(time.monotonic() - t0)
    print(f"urgent latencies (s): {[round(x, 2) for x in latencies]}")
    batch_left = sum(not r.ready() for r in batch)
    for r in batch:
        r.get(timeout=60)
    assert max(latencies[:-1]) < BOUND_S, (latencies, worker_logs(ws))
    # the job's two nodes: each may wait for one batch task in flight
    assert latencies[-1] < BOUND_S + BATCH_MS / 1000, (latencies, worker_logs(ws))
    assert batch_left >= BATCH // 2, "urgent work should have jumped the flood"


def test_priority_on_redis_serves_urgent_work_before_the_flood(compass_redis_url,
                                                                compass_workers):
    app, ws = _cluster(compass_redis_url, compass_redis_url, compass_workers,
                       ["p0@redis-pri", "p1@redis-pri"])
    _flood(app, ws)


def test_priority_on_amqp_serves_urgent_work_before_the_flood(amqp_url, compass_redis_url,
                                                               compass_workers):
    app, ws = _cluster(amqp_url, compass_redis_url, compass_workers,
                       ["p0@amqp-pri", "p1@amqp-pri"])
    _flood(app, ws)


def test_ageing_serves_batch_work_under_a_steady_stream_of_urgent_work(compass_redis_url,
                                                                        compass_workers):
    """One worker kept busy by urgent tasks: batch work waiting behind them climbs one
    level per ``compass_priority_age_s`` and runs long before the urgent stream ends."""
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_REDIS_URL": compass_redis_url,
           "COMPASS_PRIORITY_AGE_S": "0.3", "COMPASS_RECONCILE_S": "0.2"}
    ws = [compass_workers("compass_celery.emulated_app", "age@redis-pri", *GPU, env=env)]
    app = make_app(compass_redis_url, state_url=compass_redis_url, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1,
                   40, "a live worker")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    first = _infer(app, 200, 0, priority=9)
    time.sleep(0.1)  # it runs: what follows waits in the queue
    t0 = time.monotonic()
    batch = [_infer(app, 100, 1 + i, priority="batch") for i in range(2)]
    urgent = [_infer(app, 200, 10 + i, priority=9) for i in range(25)]  # ~5 s of work
    for r in batch:
        r.get(timeout=60)
    batch_s = time.monotonic() - t0
    left = sum(not r.ready() for r in urgent)
    for r in [first, *urgent]:
        r.get(timeout=60)
    print(f"batch done after {batch_s:.2f} s, {left} urgent tasks still to run")
    # 7 levels to climb at 0.3 s each, checked every 0.2 s: about 2.3 s, not 5
    assert left >= 5, (batch_s, worker_logs(ws))
