"""Per-worker queues work with ``task_create_missing_queues=False`` (as Celery's own test
configuration has it): the producer cannot list worker queues ahead of time, since their
names carry each worker's hostname."""

from __future__ import annotations

import pytest

from compass_celery import Dag
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis

GPU = ("--compass-emulate-gpu-mb", "4000", "--compass-preload", "small")


def test_tasks_and_dag_successors_reach_worker_queues_without_missing_queues(
        compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_NO_MISSING_QUEUES": "1"}
    ws = [compass_workers("tests.support.jobapp", name, *GPU, env=env)
          for name in ("a@nomissing", "b@nomissing")]
    app = make_app(compass_redis_url, task_create_missing_queues=False)
    wait_until(lambda: len(app.compass.reader.get().workers) == 2 or
               app.compass.reader.invalidate(), 30, "two live workers")
    try:
        res = app.tasks["j.src"].delay(3)
        assert res.get(timeout=20) == 3
        assert app.compass.placement(res.id).worker in {"a@nomissing", "b@nomissing"}
        dag = Dag(app, "chain")
        dag.node("a", app.tasks["j.src"].s(1))
        dag.node("b", app.tasks["j.add"].s(10), after=["a"])
        assert dag.apply_async().get(timeout=20) == {"b": 11}
    except Exception as exc:
        raise AssertionError(f"{exc!r}\n{worker_logs(ws)}") from None
