"""Draining dead workers with real processes: priorities, crashes mid-drain, garbage."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from compass_celery.broker.kombu_redis import RedisLayout
from compass_celery.local import wait_until
from compass_celery.placement import Decision
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, compass_keys_left, executions, start

pytestmark = pytest.mark.redis


def test_priority_task_on_a_dead_worker_is_replaced(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["q0@prio", "q1@prio"])
    heavy = app.tasks["j.heavy"]
    results = [heavy.apply_async((i,), priority=5) for i in range(10)]
    queue = app.compass.queue_for("q0@prio")
    sub = RedisLayout().list_for(queue, 5)
    assert sub != queue
    wait_until(lambda: app.log.llen(sub) >= 1, 5, "a priority task waiting on q0")
    ws[0].kill()  # SIGKILL with priority tasks queued in its priority list
    assert sorted(r.get(timeout=40) for r in results) == list(range(10)), worker_logs(ws)
    assert compass_keys_left(app, [queue]) == {}


def _ghost_messages(app, queue: str, n: int) -> list[str]:
    """Real task messages routed to ``queue`` as the router would, for a worker that
    is gone (a stopped worker's queue in the dead-queue set)."""
    ids = []
    for i in range(n):
        decision = Decision(task="j.src", model="small", worker="ghost@drain", queue=queue,
                            policy="compass", charge_ms=5.0, run_ms=5.0)
        task_id = uuid.uuid4().hex
        app.send_task("j.src", args=[i], queue=queue, task_id=task_id,
                      headers={"compass": decision.as_header()})
        ids.append(task_id)
    return ids


DRAINER = """
import sys, time
from compass_celery.worker.recovery import recover
from compass_celery.broker.kombu_redis import RedisQueues
from tests.support.jobapp import make_app

app = make_app(sys.argv[1], compass_heartbeat_timeout_s=1.0)
move = RedisQueues.move
def slow_move(self, *args):
    time.sleep(0.3)
    return move(self, *args)
RedisQueues.move = slow_move
recover(app.compass, "drainer@drain", 1.0)
"""


def test_a_drainer_killed_mid_drain_loses_nothing(compass_redis_url, compass_workers):
    from tests.support.jobapp import make_app

    app = make_app(compass_redis_url)
    queue = app.compass.queue_for("ghost@drain")
    ids = _ghost_messages(app, queue, 20)
    client = app.compass.store.client
    client.lpush(queue, b"\xff not json at all")
    client.lpush(queue, b'{"neither": "a celery message"}')
    client.zadd("{compass}:dead-queues", {queue: 0})  # as a stopped worker leaves it
    drainer = subprocess.Popen([sys.executable, "-c", DRAINER, compass_redis_url])
    staging = f"compass:staging:{queue}"
    wait_until(lambda: 0 < client.llen(staging) < 19, 20, "the drain to be under way")
    drainer.kill()  # SIGKILL mid-drain
    drainer.wait()
    assert client.llen(queue) == 0  # everything was staged in one step ...
    left = client.llen(staging)
    moved = client.llen(app.compass.shared_queue)
    assert left + moved + client.llen("compass:dead-letter") == 22  # ... and nothing lost
    ws = [compass_workers("tests.support.jobapp", "heir@drain", *GPU,
                          env={"COMPASS_BROKER_URL": compass_redis_url,
                               "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"})]
    wait_until(lambda: sum(executions(_log(compass_redis_url)).values()) >= 20, 40,
               "the heir to resume the drain")
    runs = executions(_log(compass_redis_url))
    assert {k: runs[k] for k in ids} == {k: 1 for k in ids}, worker_logs(ws)
    assert compass_keys_left(_log(compass_redis_url), [queue]) == {}
    dead = client.lrange("compass:dead-letter", 0, -1)
    assert len(dead) == 2 and all(queue.encode() in d for d in dead)
    log = ws[0].log() + ""
    assert "unusable" in log or left == 0  # the heir logged what it dead-lettered
    assert time.time()  # keeps the import honest for slow machines


def _log(url: str):
    import redis

    class _App:  # what executions() needs
        log = redis.Redis.from_url(url)
    return _App()


def test_a_task_longer_than_the_visibility_timeout_runs_once(compass_redis_url,
                                                             compass_workers):
    # kombu redelivers an unacked message older than the visibility timeout (1 s here,
    # scanned every second); the runner's lease keeps it from running twice.
    app, ws = start(compass_redis_url, compass_workers, ["v0@long", "v1@long"],
                    env={"COMPASS_JOBAPP_VISIBILITY_TIMEOUT": "1"})
    res = app.tasks["j.wait"].delay("long", 6.0)
    assert res.get(timeout=40) == "long", worker_logs(ws)
    # a negative check: a redelivery (scanned every second) would have run meanwhile or
    # within a second of the end; that second is its chance to show
    time.sleep(1.0)
    assert executions(app)[res.id] == 1, worker_logs(ws)


@pytest.mark.parametrize("garbage", [b"\xff not json at all", b'{"neither": "celery"}',
                                     b'{"body": "", "headers": {}, "properties": {}}'])
def test_garbage_in_a_live_workers_queue_is_dead_lettered(compass_redis_url, compass_workers,
                                                          garbage):
    app, ws = start(compass_redis_url, compass_workers, ["z0@garbage"])
    app.log.lpush(app.compass.queue_for("z0@garbage"), garbage)
    wait_until(lambda: app.log.llen("compass:dead-letter") == 1, 10,
               "the entry to be dead-lettered")
    assert app.tasks["j.src"].delay(3).get(timeout=20) == 3  # the worker keeps going
    assert ws[0].alive()
    assert "is unusable" in ws[0].log(), worker_logs(ws)
