"""The fetch window, hunted: workers SIGKILLed and restarted under their own names at random
moments (in start-up and take-back too) while plain tasks arrive; nothing may be lost."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import redis

from compass_celery.local import wait_until
from compass_celery.placement import Decision
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, start, wait_live
from tests.support.hunt import run_hunt
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
pytest_plugins = ["tests.support.amqp_fixtures"]  # amqp_vhost_url, amqp_url

#: As many kills as the benchmark's repeated-kill row (about 80 s on 2 cores).
KILLS = int(os.environ.get("COMPASS_HUNT_KILLS", "50"))


def test_no_message_is_lost_when_workers_are_killed_again_and_again(
        compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["h0@hunt", "h1@hunt"])
    app.log.config_resetstat()  # the session's Redis: count only this test's commands
    hunt = run_hunt(app, ws, kills=KILLS, every_s=1.5, rate=40.0, wait_s=60.0)
    print(hunt.summary())
    assert len(hunt.kills) == KILLS
    assert not hunt.missing, hunt.summary() + worker_logs(ws)[-3000:]
    assert not hunt.failed and not hunt.dead_lettered, hunt.summary()
    assert hunt.completed == len(hunt.sent)
    # at-least-once: only a task cut by a kill runs again, one per kill at most
    assert hunt.duplicates <= KILLS, hunt.summary()
    assert not hunt.stranded, hunt.summary()
    # the workers fetched atomically (compass_atomic_fetch's default): each message by
    # fetch.lua (by EVALSHA), whose RPOP Redis counts; kombu's own consumer only BRPOPs
    stats = app.log.info("commandstats")
    assert stats.get("cmdstat_evalsha", {}).get("calls", 0) >= hunt.completed
    assert stats.get("cmdstat_rpop", {}).get("calls", 0) >= hunt.completed


def test_nothing_is_lost_on_rabbitmq_either(amqp_url, compass_redis_url, compass_workers):
    """RabbitMQ records a delivery in its own unacked state and returns a dead consumer's
    messages to their queue, so it has no window; the same hunt, fewer kills, says so."""
    kills = max(5, KILLS // 2)
    env = {"COMPASS_BROKER_URL": amqp_url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0",
           "COMPASS_JOBAPP_STATE_URL": compass_redis_url,
           "COMPASS_JOBAPP_RESULT_URL": compass_redis_url}
    ws = [compass_workers("tests.support.jobapp", n, *GPU, env=env) for n in ("a0@hunt", "a1@hunt")]
    app = make_app(amqp_url, compass_snapshot_ttl_s=0.0, compass_heartbeat_timeout_s=1.0,
                   compass_redis_url=compass_redis_url, result_backend=compass_redis_url)
    wait_live(app, 2, ws)
    app.log = redis.Redis.from_url(compass_redis_url)
    hunt = run_hunt(app, ws, kills=kills, every_s=1.5, rate=40.0, wait_s=60.0)
    print(hunt.summary())
    assert not hunt.missing and not hunt.failed, hunt.summary() + worker_logs(ws)[-3000:]
    assert hunt.completed == len(hunt.sent) and hunt.duplicates <= kills, hunt.summary()


def test_a_dead_workers_shared_queue_task_comes_back_within_a_heartbeat_timeout(
        compass_redis_url, compass_workers):
    """A task a worker fetched from the shared queue has the shared queue as its routing
    key, so neither its worker's drain nor its take-back saw it: it sat in kombu's unacked
    hash until the visibility timeout (an hour). Its lease lapsing now brings it back."""
    app, ws = start(compass_redis_url, compass_workers, ["s0@hunt"])
    shared, client = app.compass.shared_queue, app.log
    decision = Decision(task="j.src", model="small", worker="gone@hunt", queue=shared,
                        policy="compass", charge_ms=5.0, run_ms=5.0)
    task_id = uuid.uuid4().hex
    app.send_task("j.src", args=[7], queue="compass.nobody", task_id=task_id,
                  headers={"compass": decision.as_header()})
    message = json.loads(client.rpop("compass.nobody"))
    message["properties"]["delivery_info"]["routing_key"] = shared
    tag = message["properties"]["delivery_tag"]
    now = float(client.time()[0])  # a dead worker's fetch: in flight, leased long ago
    client.hset("unacked", tag, json.dumps([message, "", shared]))
    client.zadd("unacked_index", {tag: time.time()})
    client.zadd("compass:leases", {tag: now - 5})
    assert app.AsyncResult(task_id).get(timeout=20) == 7, worker_logs(ws)
    wait_until(lambda: not client.hexists("unacked", tag), 10, "the task's ack")
    assert int(client.hget("execs", task_id)) == 1


def test_an_idle_worker_fetching_atomically_wakes_for_every_list_it_reads(
        compass_redis_url, compass_workers):
    """An idle worker waits on its queues' bells (and on the lists of a queue compass does
    not own, Celery's default here); a message on any of them starts at once, whatever
    list the worker's last message came from: the wait is not tied to one list. Slower
    than kombu's BRPOP timeout (1 s) would mean a missed wake-up."""
    app, ws = start(compass_redis_url, compass_workers, ["w0@wake"])
    own = app.compass.queue_for("w0@wake")
    sends = [("own, urgent", {"queue": own, "priority": 9}),
             ("own, lowest", {"queue": own, "priority": 0}),
             ("shared", {"queue": app.compass.shared_queue}),
             ("celery's default queue", {"queue": "celery"})]
    for _ in range(2):
        for label, options in sends:
            time.sleep(1.3)  # past a wait's timeout: blocked afresh, on the bells
            t = time.monotonic()
            assert app.send_task("j.src", args=[1], **options).get(timeout=10) == 1
            took = time.monotonic() - t
            assert took < 0.7, f"{label}: {took:.2f} s" + worker_logs(ws)[-2000:]


def test_a_wake_on_another_queue_leaves_the_worker_one_message(compass_redis_url,
                                                                 compass_workers):
    """A message of its own queue that rang no bell (pushed by hand here), then one on
    Celery's default queue: the wait pops the second, and the look queued behind it takes
    the first, which goes back to its list (unfetch.lua) until the worker is free. Both
    run once; none is left in flight."""
    app, ws = start(compass_redis_url, compass_workers, ["u0@wake"])
    client, own = app.log, app.compass.queue_for("u0@wake")
    for _ in range(3):
        time.sleep(1.3)  # idle: blocked on the bells
        first = uuid.uuid4().hex
        app.send_task("j.src", args=[2], queue="compass.nobody", task_id=first)
        client.lpush(own, client.rpop("compass.nobody"))  # no token
        second = app.send_task("j.src", args=[3], queue="celery")
        assert second.get(timeout=10) == 3
        assert app.AsyncResult(first).get(timeout=10) == 2, worker_logs(ws)[-2000:]
        assert int(client.hget("execs", first)) == 1 == int(client.hget("execs", second.id))
    wait_until(lambda: not client.llen(own) and not any(
        own.encode() in v for v in client.hvals("unacked")), 10, "nothing left in flight")
