"""An interactive job's plan sees the batch task its worker took, with real workers.

Traced on the real cluster (docs/results/mixed/real-sheds.txt), the interactive jobs shed
there were planned to start at once on a worker that had just taken a batch task the plan
did not see, so their first step waited a whole batch run: a worker loading the batch
task's model looked idle (its queued count and running span were published only once the
model was in), and admission planned on a snapshot up to ~70 ms old, older than the
worker's start. Here worker one is the interactive step's best worker while idle (its
model resident; two must load it), and it is busy with a batch task when the job is
planned: the plan must put the step on two, where it meets its deadline."""

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
STEP, BATCH = "sa", "sb"
# the step's model loads in 0.2 s (300 MB at the default 1500 MB/s); the batch model's in
# 1 s, when one does not hold it yet
MODELS = {STEP: 300.0, BATCH: 1500.0}
STEP_MS = 500.0  # on one: 500 ms idle; on two: ~200 ms load + 500 ms
BATCH_MS = 1500.0  # a step behind it on one misses the deadline
DEADLINE_MS = 1500.0


def _cluster(url: str, compass_workers, one_preload: str, ttl_s: float, **conf):
    env = {"COMPASS_BROKER_URL": url, "COMPASS_REDIS_URL": url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0", "COMPASS_MODELS": json.dumps(MODELS)}
    common = ["--compass-emulate-gpu-mb", "3200"]
    ws = [compass_workers("compass_celery.emulated_app", "sees@one", *common,
                          "--compass-preload", one_preload, env=env),
          # two cannot hold the batch model: the batch task goes to one
          compass_workers("compass_celery.emulated_app", "sees@two",
                          "--compass-emulate-gpu-mb", "1000", env=env)]
    app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=ttl_s,
                       compass_models=MODELS, **conf)
    # the batch producer: another process's app, whose sends the interactive one's
    # snapshot learns of only by reading the state
    batch_app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=0.0,
                             compass_models=MODELS)
    wait_live(app, 2, ws, 40)
    wait_until(lambda: STEP in next(w for w in app.compass.store.snapshot(
        time.time(), 3.0).workers if w.name == "sees@one").resident, 20, "one's preload")
    app.workers, app.batch_app = ws, batch_app
    return app


def _batch_on_one(app):
    """A batch task, sent by the batch producer: to one, the only worker its model fits."""
    infer = app.batch_app.tasks["emulated.infer"]
    return infer.apply_async((BATCH, BATCH_MS, "b"), priority=0,
                             compass={"model": BATCH, "exec_ms": BATCH_MS})


def _interactive(app):
    dag = Dag(app, "click")
    infer = app.tasks["emulated.infer"]
    dag.node("a", infer.s(STEP, STEP_MS, 0), model=STEP, exec_ms=STEP_MS)
    sent = time.monotonic()
    job = dag.apply_async(deadline_ms=DEADLINE_MS, priority=9)
    try:
        job.get(timeout=30)
        failed = None
    except Exception as exc:  # shed: what the assertions below report
        failed = exc
    return job, (time.monotonic() - sent) * 1000, failed


def _taken_by_one(app, loading: bool) -> None:
    """Wait until one has taken the batch task: its model loading there (``loading``),
    or the task running (its model resident already)."""
    def taken() -> bool:
        one = next(w for w in app.compass.store.snapshot(time.time(), 3.0).workers
                   if w.name == "sees@one")
        return BATCH in one.loading if loading else bool(one.running)
    wait_until(taken, 10, "one taking the batch task")


def _placed_on_the_free_worker(app, batch) -> None:
    """The interactive job goes to two (free) and meets its deadline; the batch task
    stays on one."""
    job, took_ms, failed = _interactive(app)
    where = job.placement()["a"]["planned"]  # (if placed on one, it never ran: shed)
    assert where.endswith("two") and failed is None, (where, failed, took_ms,
                                                      worker_logs(app.workers))
    assert took_ms < DEADLINE_MS, (took_ms, worker_logs(app.workers))
    assert batch.get(timeout=30)["worker"].endswith("one")


@pytest.fixture
def loading_cluster(compass_redis_url, compass_workers):
    app = _cluster(compass_redis_url, compass_workers, STEP, ttl_s=0.0)
    yield app
    app.batch_app.compass.close()
    app.compass.close()


def test_a_worker_loading_a_batch_tasks_model_is_planned_busy(loading_cluster):
    """One takes the batch task and loads its model (1 s): it is busy for the load and
    the run, though no run has begun; the plan (on state read now) sees it so."""
    app = loading_cluster
    batch = _batch_on_one(app)
    _taken_by_one(app, loading=True)
    _placed_on_the_free_worker(app, batch)


@pytest.fixture
def stale_cluster(compass_redis_url, compass_workers):
    # the interactive producer keeps a snapshot 30 s: only a read the job asks for is new
    app = _cluster(compass_redis_url, compass_workers, f"{STEP},{BATCH}", ttl_s=30.0)
    yield app
    app.batch_app.compass.close()
    app.compass.close()


def test_a_deadline_job_is_planned_on_state_read_now(stale_cluster):
    """The interactive producer's snapshot was taken before one started the batch task
    (sent by another producer): a job with a deadline reads the state again."""
    app = stale_cluster
    app.compass.reader.get()  # both idle, as this producer last saw them
    batch = _batch_on_one(app)
    _taken_by_one(app, loading=False)
    _placed_on_the_free_worker(app, batch)


@pytest.fixture
def lenient_cluster(compass_redis_url, compass_workers):
    # the same, with a job with a deadline allowed state a minute old
    app = _cluster(compass_redis_url, compass_workers, f"{STEP},{BATCH}", ttl_s=30.0,
                   compass_deadline_state_max_age_ms=60_000.0)
    yield app
    app.batch_app.compass.close()
    app.compass.close()


def test_a_deadline_job_plans_on_state_as_old_as_compass_deadline_state_max_age_ms(
        lenient_cluster):
    """compass_deadline_state_max_age_ms bounds the read (a large cluster trades the
    fresh read for stale state): within it, the job plans on the snapshot read before
    one took the batch task, and puts its step on one, where its model is."""
    app = lenient_cluster
    app.compass.reader.get()  # both idle, as this producer last saw them
    batch = _batch_on_one(app)
    _taken_by_one(app, loading=False)
    job, took_ms, failed = _interactive(app)
    assert job.placement()["a"]["planned"].endswith("one"), (failed, took_ms)
    assert batch.get(timeout=30)["worker"].endswith("one")
