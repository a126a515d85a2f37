"""The worker's reconcile never counts its own task's end twice (real Redis, a real worker).

The reconcile sets the worker's backlog to what runs plus what waits. An ended task left the
running set before its end's release reached Redis (in the pipeline that completes its job and
sends its successors); a reconcile in between set the backlog without it and the release took
it off again: the backlog below the queued work it contains, which a level-9 plan reads as a
free worker (docs/results/mixed/real-sheds.txt). Here the reconcile runs every 50 ms while
two-step jobs end one after another behind queued batch work, and the backlog is sampled
against the queued work, both read in one step."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from compass_celery import Dag
from compass_celery.emulated import make_app as emulated_app
from compass_celery.state import keys
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live

pytestmark = pytest.mark.redis
MODELS = {"m": 100.0}
NAME = "race@one"


def _sample(client, prefix: str, stop: threading.Event, out: list) -> None:
    """(backlog, queued work) of the worker, read together, every ~2 ms until ``stop``."""
    backlog_key = keys.key(keys.BACKLOG, prefix)
    queued_key = keys.key(keys.QUEUED, prefix)
    members = [keys.queued_member(NAME, level) for level in range(10)]
    while not stop.is_set():
        with client.pipeline(transaction=True) as pipe:
            pipe.hget(backlog_key, NAME)
            pipe.hmget(queued_key, members)
            backlog, queued = pipe.execute()
        if backlog is not None:
            out.append((float(backlog), sum(float(q or 0) for q in queued)))
        time.sleep(0.002)


@pytest.fixture
def racy(compass_redis_url, compass_workers):
    url = compass_redis_url
    env = {"COMPASS_BROKER_URL": url, "COMPASS_REDIS_URL": url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0", "COMPASS_MODELS": json.dumps(MODELS),
           "COMPASS_RECONCILE_S": "0.05"}
    ws = [compass_workers("compass_celery.emulated_app", NAME, "--compass-emulate-gpu-mb",
                          "1000", "--compass-preload", "m", env=env)]
    app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=0.0, compass_models=MODELS)
    wait_live(app, 1, ws, 40)
    app.workers = ws
    yield app
    app.compass.close()


def test_a_reconcile_never_drops_an_ended_task_twice(racy):
    app = racy
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    client = redis.Redis.from_url(app.conf.broker_url)
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(
        client, app.compass.settings.key_prefix, stop, samples), daemon=True)
    sampler.start()
    try:
        # batch work queued all along (level 0), and jobs ending one after another
        batch = [infer.apply_async(("m", 40.0, i), priority=0,
                                   compass={"model": "m", "exec_ms": 40.0}) for i in range(40)]
        jobs = []
        for i in range(40):
            dag = Dag(app, f"j{i}")
            a = dag.node("a", infer.s("m", 20.0, i), model="m", exec_ms=20.0)
            dag.node("b", step.s("m", 20.0), after=[a], model="m", exec_ms=20.0)
            jobs.append(dag.apply_async(priority=9))
        for job in jobs:
            job.get(timeout=60)
        for r in batch:
            r.get(timeout=60)
    finally:
        stop.set()
        sampler.join(5)
    assert len(samples) > 200, len(samples)
    short = [(b, q) for b, q in samples if b < q - 1.0]  # queued work is part of the backlog
    assert not short, (len(short), short[:5], worker_logs(app.workers)[-2000:])
