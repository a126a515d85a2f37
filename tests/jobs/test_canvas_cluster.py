"""Dag.from_canvas on a real Redis and real compass workers: the same canvases run by
Celery itself and as planned jobs give the same results."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
NAMES = ["canvas0@cvcluster", "canvas1@cvcluster"]

# name -> (canvas factory over (src, add, collect, sum1), the value Celery returns)
CANVASES: dict[str, tuple[Callable[..., Any], Any]] = {
    "chain": (lambda s, a, c, u: s.s(1) | a.s(2) | a.s(3), 6),
    "group": (lambda s, a, c, u: group(s.s(1), a.s(2, 3), s.s(4)), [1, 5, 4]),
    "chord": (lambda s, a, c, u: chord([s.s(1), s.s(2), a.s(1, 2)], c.s()), [1, 2, 3]),
    "chain of a chord": (lambda s, a, c, u: chain(
        s.s(1), chord([a.s(1), a.s(2)], c.s()), u.s()), 6),
    "group then group": (lambda s, a, c, u: chain(
        s.s(1), group(a.s(1), a.s(2)), group(c.s(), u.s())), [[2, 3], 6]),
}


@pytest.fixture
def app(compass_redis_url: str, compass_workers: Callable[..., Any]) -> Celery:
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    gpu = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "big,small"]
    workers = [compass_workers("tests.support.jobapp", name, *gpu, env=env)
               for name in NAMES]
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    store = app.compass.store
    try:
        wait_until(lambda: {w.name for w in store.snapshot(time.time(), 3.0).workers}
                   >= set(NAMES), 30, "two canvas workers")
    except TimeoutError:
        raise AssertionError(worker_logs(workers)) from None
    app.workers = workers
    app.log = redis.Redis.from_url(compass_redis_url)
    return app


def test_canvases_give_celerys_results_as_planned_jobs(app: Celery) -> None:
    t = app.tasks
    sigs = t["j.src"], t["j.add"], t["j.collect"], t["j.sum1"]
    for name, (build, expected) in CANVASES.items():
        celery_value = build(*sigs).apply_async().get(timeout=20)
        assert celery_value == expected, (name, worker_logs(app.workers))
        dag = Dag.from_canvas(build(*sigs), name)
        job = dag.apply_async()
        assert dag.canvas_result(job, timeout=20) == celery_value, (
            name, worker_logs(app.workers))
        # the whole canvas ran as one planned job on our workers, each node once
        where = job.placement()
        assert set(where) == set(dag.nodes), name
        assert {w["worker"] for w in where.values()} <= set(NAMES), (name, where)
        entries = [e.decode().split(":") for e in app.log.lrange("ran", 0, -1)]
        ran = Counter(node for job_id, node, _ in entries if job_id == job.id)
        assert ran == Counter(dict.fromkeys(dag.nodes, 1)), (name, ran)
