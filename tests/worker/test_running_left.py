"""A real worker publishes what it runs, and a plan counts only what is left of it: an
urgent task sent while a long batch task runs is predicted behind the rest of that task,
not behind the whole of it as if it had just started."""

from __future__ import annotations

import time

import pytest

from compass_celery.errors import Rejected
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import emulated

pytestmark = pytest.mark.redis
M = "captioner"


@pytest.fixture
def one(compass_redis_url, compass_workers):
    app = emulated(compass_redis_url, compass_workers, None, ["left@one"],
                   "--compass-emulate-gpu-mb", "1600", "--compass-preload", M)
    yield app
    app.compass.close()


def _urgent_prediction(app) -> float:
    """The predicted finish of a 50 ms task with a 300 ms deadline: it is refused (the
    batch task runs ahead of it), and the refusal says when it would have finished."""
    with pytest.raises(Rejected) as err:
        app.tasks["emulated.infer"].apply_async(
            (M, 50.0, 0), compass={"model": M, "exec_ms": 50.0, "deadline_ms": 300})
    assert "predicted to finish in" in str(err.value) and err.value.cause == "deadline"
    return err.value.predicted_ms


def test_an_urgent_task_waits_only_for_what_is_left_of_the_running_one(one):
    app = one
    batch = app.tasks["emulated.infer"].apply_async(
        (M, 4000.0, 0), compass={"model": M, "exec_ms": 4000.0})

    def running():
        workers = app.compass.store.snapshot(time.time(), 3.0).workers
        return workers[0].running if workers else ()

    try:
        wait_until(lambda: bool(running()), 10, "the batch task to be published as running")
    except TimeoutError:
        raise AssertionError(worker_logs(app.workers)) from None
    (began, ends, charge), = running()
    assert charge >= 4000.0 and ends - began == pytest.approx(charge / 1000.0)
    time.sleep(max(0.0, began + 0.5 - time.time()))
    early = _urgent_prediction(app)  # 0.5 s in: about 3.5 s of it left
    time.sleep(max(0.0, began + 2.5 - time.time()))
    late = _urgent_prediction(app)  # 2.5 s in: about 1.5 s left
    assert 3000.0 < early < 4000.0, early
    assert 1000.0 < late < 2000.0, late
    assert early - late == pytest.approx(2000.0, abs=400.0)  # it shrinks as the task runs
    # both refusals are counted, cluster-wide, under no class (a bare deadline) and why
    assert app.compass.store.refusals() == {"none": {"deadline": 2}}
    assert batch.get(timeout=20) is not None
    wait_until(lambda: not running(), 10, "the ended task to leave the record")
