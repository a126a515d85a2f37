"""The held slot with real workers (``worker.core.slot_held_until`` in fetch.lua): a
worker whose queue holds batch work does not start it while an interactive Dag's second
step is planned on it, so the step does not wait a whole batch run and the job meets its
deadline; when the planned step never comes (the count left set), batch work runs once
the bound (``compass_hold_max_ms``) has passed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
import redis

from compass_celery import Dag
from compass_celery.emulated import make_app as emulated_app
from compass_celery.local import wait_until
from compass_celery.state import keys
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live

pytestmark = pytest.mark.redis
FIRST, SECOND, BATCH = "ia", "ib", "bm"
MODELS = {FIRST: 1500.0, SECOND: 1500.0, BATCH: 1500.0}
FIRST_MS, SECOND_MS = 600.0, 100.0  # the interactive Dag: a on one, b on two
BATCH_MS = 1500.0  # a batch task: two would start one in the gap without the hold
DEADLINE_MS = 1500.0  # met with b run on arrival; missed behind a batch run
HOLD_MAX_MS = 2500.0


def _cluster(url: str, compass_workers, hold_max_ms: float):
    """hold@one holds the first step's model, hold@two the second's and batch's."""
    env = {"COMPASS_BROKER_URL": url, "COMPASS_REDIS_URL": url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0", "COMPASS_MODELS": json.dumps(MODELS),
           "COMPASS_HOLD_MAX_MS": str(hold_max_ms)}
    common = ["--compass-emulate-gpu-mb", "3200"]
    ws = [compass_workers("compass_celery.emulated_app", "hold@one", *common,
                          "--compass-preload", FIRST, env=env),
          compass_workers("compass_celery.emulated_app", "hold@two", *common,
                          "--compass-preload", f"{SECOND},{BATCH}", env=env)]
    app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=0.0, compass_models=MODELS)
    wait_live(app, 2, ws, 40)
    wait_until(lambda: all(w.resident for w in app.compass.store.snapshot(
        time.time(), 3.0).workers), 20, "the preloads resident")
    app.workers = ws
    return app


@pytest.fixture
def held(compass_redis_url, compass_workers):
    app = _cluster(compass_redis_url, compass_workers, HOLD_MAX_MS)
    yield app
    app.compass.close()


def _batch(app, i: int):
    infer = app.tasks["emulated.infer"]
    return infer.apply_async((BATCH, BATCH_MS, f"b{i}"), priority=0,
                             compass={"model": BATCH, "exec_ms": BATCH_MS})


def _done_at(result) -> float:
    """When a task ended (epoch s), from its result's date_done."""
    done = result._get_task_meta()["date_done"]
    if isinstance(done, str):
        done = datetime.fromisoformat(done)
    if done.tzinfo is None:
        done = done.replace(tzinfo=UTC)
    return done.timestamp()


def test_batch_waits_for_the_planned_second_step_which_meets_its_deadline(held):
    app = held
    dag = Dag(app, "click")
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    a = dag.node("a", infer.s(FIRST, FIRST_MS, 0), model=FIRST, exec_ms=FIRST_MS)
    dag.node("b", step.s(SECOND, SECOND_MS), after=[a], model=SECOND, exec_ms=SECOND_MS)
    sent = time.monotonic()
    job = dag.apply_async(deadline_ms=DEADLINE_MS, priority=9)
    batch = [_batch(app, i) for i in range(2)]  # queued on two while b is planned there
    job.get(timeout=30)
    took_ms = (time.monotonic() - sent) * 1000
    where = job.placement()
    assert where["a"]["worker"].endswith("one") and where["b"]["worker"].endswith("two")
    on_two = [r for r in batch if r.get(timeout=30)["worker"].endswith("two")]  # none lost
    assert on_two, "no batch task was placed on two: not a test"
    b_started = where["b"]["started"]
    first_batch_start = min(_done_at(r) for r in on_two) - BATCH_MS / 1000
    assert first_batch_start > b_started - 0.05, (first_batch_start - b_started,
                                                  worker_logs(app.workers))
    assert took_ms < DEADLINE_MS, (took_ms, worker_logs(app.workers))


@pytest.fixture
def bounded(request, compass_redis_url, compass_workers):
    """The two workers, holding their slot for at most ``request.param`` ms."""
    app = _cluster(compass_redis_url, compass_workers, request.param)
    yield app
    app.compass.close()


@contextmanager
def _planned_count_left_set(app) -> Iterator[None]:
    """Two's level-9 planned count left set (a successor that never comes: its job
    failed), so two holds its slot for the bound at every look."""
    log = redis.Redis.from_url(app.conf.broker_url)
    planned = keys.key(keys.PENDING_QUEUED, app.compass.settings.key_prefix)
    member = keys.queued_member("hold@two", 9)
    log.hset(planned, member, 500.0)
    try:
        yield
    finally:
        log.hdel(planned, member)


@pytest.mark.parametrize("bounded", [1000.0], indirect=True)
def test_a_planned_count_left_set_holds_batch_only_for_the_bound(bounded):
    """Two's level-9 planned count is left set; its batch task still starts, about the
    bound (1 s) after it arrived."""
    app = bounded
    with _planned_count_left_set(app):
        sent = time.time()
        r = _batch(app, 0)
        assert r.get(timeout=20)["worker"].endswith("two")
        started = _done_at(r) - BATCH_MS / 1000 - sent
        assert 0.8 < started < 1.0 + 1.2, (started, worker_logs(app.workers))


@pytest.mark.parametrize("bounded", [2000.0], indirect=True)
def test_a_held_slot_takes_lower_work_with_a_deadline_and_holds_work_without(bounded):
    """Two's level-9 planned count is left set: a level-0 job with a deadline of its own
    (its message's compass header carries its due time) starts at once; a batch task
    without a deadline, queued behind it, is still held for the bound (2 s)."""
    app = bounded
    with _planned_count_left_set(app):
        infer = app.tasks["emulated.infer"]
        dag = Dag(app, "document")
        dag.node("d", infer.s(BATCH, 300.0, "d"), model=BATCH, exec_ms=300.0)
        sent = time.time()
        job = dag.apply_async(deadline_ms=5000.0, priority=0)
        r = _batch(app, 0)
        job.get(timeout=20)
        where = job.placement()["d"]
        assert where["worker"].endswith("two"), where
        assert where["started"] - sent < 1.0, (where["started"] - sent,
                                               worker_logs(app.workers))
        assert r.get(timeout=20)["worker"].endswith("two")
        batch_started = _done_at(r) - BATCH_MS / 1000 - sent
        assert batch_started > 1.8, (batch_started, worker_logs(app.workers))
