"""A completion that dies between recording its output and sending its successors resumes:
the retry (or a redelivery) sends them, exactly once."""

from __future__ import annotations

import pytest
import redis

from compass_celery.broker.kombu_redis import RedisLayout
from compass_celery.jobs.dag import Dag
from compass_celery.jobs.runtime import JobRuntime
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis


def test_interrupted_completion_sends_successors_once_on_retry(compass_redis_url,
                                                               monkeypatch):
    app = make_app(compass_redis_url)
    client = redis.Redis.from_url(compass_redis_url)
    dag = Dag(app, "resume")
    a = dag.node("a", app.tasks["j.src"].s(1))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    dag.node("c", app.tasks["j.add"].s(2), after=[a])
    job = dag.apply_async()  # no live worker: the source waits on the shared queue
    shared = app.compass.shared_queue

    def waiting() -> int:  # every priority list of the shared queue
        return sum(client.llen(name) for name in RedisLayout().lists(shared))
    assert waiting() == 1
    runtime = JobRuntime(app.compass, "w@resume")
    real_send = app.send_task
    calls = {"n": 0}

    def flaky_send(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # b goes out, then the broker fails on c
            raise ConnectionError("broker went away")
        return real_send(*args, **kwargs)

    monkeypatch.setattr(app, "send_task", flaky_send)
    done = {"id": job.id, "node": "a"}
    with pytest.raises(ConnectionError):
        runtime.on_success(done, "task-a", 1, {})
    assert waiting() == 2  # a and b; c was released but not sent
    # the retry finds a's output already recorded and sends only what was never sent
    assert len(runtime.on_success(done, "task-a", 1, {})) == 1
    assert waiting() == 3
    # a further duplicate (a redelivery of a) sends nothing at all
    assert runtime.on_success(done, "task-a", 1, {}) == []
    assert waiting() == 3
    assert set(client.hkeys(f"compass:job:{{{job.id}}}:tasks")) == {b"a", b"b", b"c"}
