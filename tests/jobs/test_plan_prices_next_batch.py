"""An interactive job's plan does not count on a worker that is about to be free while
batch work waits for it, with real workers.

Traced on navigator-mixed at 8 jobs/s (docs/results/race), the level-9 steps that waited a
whole batch run were placed on a worker whose state showed it free (between two tasks, or
its task about to end) with batch work queued and no held slot: it took its next batch
task in the milliseconds before the step landed. ``planner.priority.race_ms`` plans such a
worker as starting one batch task first. Here worker one (the step's model resident) runs
a batch task past its declared end (its state says it ends now: about to be free) with
another batch task queued behind it; two is idle and must load the model. Whatever takes
one first, its batch work, the step waits behind it there: the plan must put the step on
two, where it meets its deadline."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery import Dag
from compass_celery.emulated import make_app as emulated_app
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live

pytestmark = pytest.mark.redis
STEP, BATCH = "ra", "rb"
# the step's model loads in 0.2 s on two (300 MB at 1500 MB/s); two cannot hold the
# batch model, so the batch tasks go to one
MODELS = {STEP: 300.0, BATCH: 1500.0}
STEP_MS = 500.0  # on one, free: 500 ms; on two: ~200 ms load + 500 ms
DECLARED_MS = 1000.0  # what the running batch task says it runs
RUNS_MS = 2600.0  # what it runs: past its declared end, one looks about to be free
QUEUED_MS = 1500.0  # the batch task waiting behind it
DEADLINE_MS = 1500.0


@pytest.fixture
def race_cluster(compass_redis_url, compass_workers):
    url = compass_redis_url
    env = {"COMPASS_BROKER_URL": url, "COMPASS_REDIS_URL": url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0", "COMPASS_MODELS": json.dumps(MODELS),
           "COMPASS_HOLD_MAX_MS": "1000"}
    ws = [compass_workers("compass_celery.emulated_app", "race@one",
                          "--compass-emulate-gpu-mb", "3200", "--compass-preload",
                          f"{STEP},{BATCH}", env=env),
          compass_workers("compass_celery.emulated_app", "race@two",
                          "--compass-emulate-gpu-mb", "1000", env=env)]
    # the race is priced where the workers hold their slot, as the app says they do
    app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=0.0, compass_models=MODELS,
                       compass_hold_max_ms=1000.0)
    wait_live(app, 2, ws, 40)
    wait_until(lambda: {STEP, BATCH} <= _one(app).resident, 20, "one's preload")
    app.workers = ws
    yield app
    app.compass.close()


def _one(app):
    return next(w for w in app.compass.store.snapshot(time.time(), 3.0).workers
                if w.name == "race@one")


def _batch(app, runs_ms: float, declared_ms: float):
    infer = app.tasks["emulated.infer"]
    return infer.apply_async((BATCH, runs_ms, "b"), priority=0,
                             compass={"model": BATCH, "exec_ms": declared_ms})


def _about_to_be_free(app) -> bool:
    """One runs the first batch task past its declared end, the second one queued."""
    one = _one(app)
    return bool(one.running) and all(ends <= time.time() for _, ends, _ in one.running) \
        and one.queued_ms.get(0, 0.0) >= QUEUED_MS


def test_a_worker_about_to_be_free_with_batch_waiting_is_planned_busy(race_cluster):
    app = race_cluster
    first = _batch(app, RUNS_MS, DECLARED_MS)
    second = _batch(app, QUEUED_MS, QUEUED_MS)
    wait_until(lambda: _about_to_be_free(app), 10, "one past its batch task's declared end")
    dag = Dag(app, "click")
    dag.node("a", app.tasks["emulated.infer"].s(STEP, STEP_MS, 0), model=STEP,
             exec_ms=STEP_MS)
    sent = time.monotonic()
    job = dag.apply_async(deadline_ms=DEADLINE_MS, priority=9)
    try:
        job.get(timeout=30)
        failed = None
    except Exception as exc:  # shed or late: reported below
        failed = exc
    took_ms = (time.monotonic() - sent) * 1000
    where = job.placement()["a"]["planned"]
    assert where.endswith("two") and failed is None, (where, failed, took_ms,
                                                      worker_logs(app.workers))
    assert took_ms < DEADLINE_MS, (took_ms, worker_logs(app.workers))
    assert first.get(timeout=30)["worker"].endswith("one")
    assert second.get(timeout=30)["worker"].endswith("one")
