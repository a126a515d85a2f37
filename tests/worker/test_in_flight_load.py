"""A model load in flight is in the worker's record, and plans count what is left of it:
the next task for that model goes to the worker already loading it, not to an idle one
that would load it a second time (real workers, real Redis)."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.state import keys
from compass_celery.testing import worker_logs
from tests.support.emulated import one_emulated

pytestmark = pytest.mark.redis

#: 3,000 MB at the emulated GPU's default 1,500 MB/s: a 2 s load.
BIG_MB = 3000.0
FULL_LOAD_MS = 2000.0


def _one_node_job(app, name: str):
    dag = Dag(app, name)
    dag.node("a", app.signature("emulated.infer", args=("big", 50, None)), model="big",
             exec_ms=50)
    return dag.apply_async()


def _plan(app, job) -> dict:
    return json.loads(app.compass.store.client.hget(job.keys.job, "plan"))["a"]


def _loads(app) -> int:
    stats = app.compass.store.client.hgetall(keys.key(keys.WORKER_STATS, "compass"))
    return sum(int(json.loads(raw).get("loads", 0)) for raw in stats.values())


def test_the_next_task_waits_for_the_load_in_flight(compass_redis_url, compass_workers):
    gpu = ("--compass-emulate-gpu-mb", "8000")
    app, w0 = one_emulated(compass_redis_url, compass_workers, "g0@inflight",
                           {"big": BIG_MB}, *gpu)
    _, w1 = one_emulated(compass_redis_url, compass_workers, "g1@inflight",
                         {"big": BIG_MB}, *gpu)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5.0).workers) == 2, 30,
               "both records")

    first = _one_node_job(app, "first")
    loader = _plan(app, first)["worker"]

    def loading():
        views = {v.name: v for v in app.compass.store.snapshot(time.time(), 5.0).workers}
        got = views[loader].loading.get("big")
        return got if got is not None and got[0] <= time.time() < got[1] else None

    try:
        started, ends = wait_until(loading, 5, "the load in the record")
    except TimeoutError:
        raise AssertionError(worker_logs([w0, w1])) from None
    assert ends - started == pytest.approx(FULL_LOAD_MS / 1000, rel=0.05)
    # a quarter of it done: a point on the load's own timeline, not an event to wait on
    time.sleep(max(0.0, started + 0.5 - time.time()))

    second = _one_node_job(app, "second")
    placed = _plan(app, second)
    assert placed["worker"] == loader  # not the idle worker, which would load it again
    # what is left of the load, not a whole one, and not nothing
    assert 0 < placed["load_ms"] < FULL_LOAD_MS - 400, placed

    for job in (first, second):
        job.get(timeout=30)
    assert _loads(app) == 1
    loader_proc = w0 if loader.startswith("g0") else w1
    assert "compass: loaded model big in " in loader_proc.log()  # what an operator reads
