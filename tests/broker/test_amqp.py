"""RabbitMQ as the broker, compass state in Redis: routing, hand-back, drains, marks.

Real ``rabbitmq-server`` (a private vhost per session, tests/amqp_fixtures.py), a
private ``redis-server`` for the state, and real worker processes of the emulated
app, whose ledger (``COMPASS_BENCH_LEDGER_URL``) counts every execution.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
import redis

from compass_celery.broker.amqp import AmqpQueues
from compass_celery.emulated import make_app
from compass_celery.local import wait_until
from compass_celery.placement import Decision
from compass_celery.state import keys
from compass_celery.testing import worker_logs
from compass_celery.worker.recovery import recover

pytest_plugins = ["tests.support.amqp_fixtures"]  # amqp_vhost_url, amqp_url
pytestmark = pytest.mark.redis

GPU = ["--compass-emulate-gpu-mb", "1600"]
TIMEOUT_S = 1.5


def _env(amqp: str, state: str) -> dict[str, str]:
    return {"COMPASS_BROKER_URL": amqp, "COMPASS_REDIS_URL": state,
            "COMPASS_BENCH_LEDGER_URL": state, "COMPASS_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S),
            "COMPASS_RECONCILE_S": "0.5"}


def _cluster(amqp: str, state: str, compass_workers, names: list[str], preload: str = ""):
    extra = ["--compass-preload", preload] if preload else []
    ws = [compass_workers("compass_celery.emulated_app", n, *GPU, *extra, env=_env(amqp, state))
          for n in names]
    app = make_app(amqp, state_url=state, compass_heartbeat_timeout_s=TIMEOUT_S,
                   compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), TIMEOUT_S).workers)
                   == len(names), 40, f"{len(names)} live workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    return app, ws


def _burst(app, n: int, exec_ms: float) -> list:
    """``n`` captioner tasks of ``exec_ms`` each, routed by compass; data = their index."""
    infer = app.tasks["emulated.infer"]
    return [infer.apply_async(("captioner", exec_ms, i),
                              compass={"model": "captioner", "exec_ms": exec_ms})
            for i in range(n)]


def _ledger(state: str, template: str = keys.BENCH_EXECS) -> Counter[str]:
    client = redis.Redis.from_url(state)
    return Counter({k.decode(): int(v) for k, v in
                    client.hgetall(keys.key(template, "compass")).items()})


def _ghosts(app, queue: str, n: int) -> list[str]:
    """Task messages routed to ``queue`` as the router would, for a worker that is gone."""
    ids = []
    for i in range(n):
        decision = Decision(task="emulated.detect", model="detector", worker="ghost",
                            queue=queue, policy="compass", charge_ms=30.0, run_ms=30.0)
        task_id = uuid.uuid4().hex
        app.send_task("emulated.detect", args=[i], queue=queue, task_id=task_id,
                      headers={"compass": decision.as_header()})
        ids.append(task_id)
    return ids


def test_tasks_route_to_per_worker_queues_and_a_late_queue_keeps_its_messages(
        amqp_url, compass_redis_url, compass_workers):
    app, ws = _cluster(amqp_url, compass_redis_url, compass_workers, ["cap@amqp-r"],
                       preload="captioner")
    ws.append(compass_workers("compass_celery.emulated_app", "det@amqp-r", *GPU,
                              "--compass-preload", "detector",
                              env=_env(amqp_url, compass_redis_url)))
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), TIMEOUT_S).workers) == 2,
               40, "two live workers")
    app.compass.reader.invalidate()
    res_c = app.tasks["emulated.caption"].delay("img-1")
    res_d = app.tasks["emulated.detect"].delay("img-2")
    assert app.compass.placement(res_c.id).queue == "compass.w.cap@amqp-r"
    assert res_c.get(timeout=20)["worker"] == "cap@amqp-r", worker_logs(ws)
    assert res_d.get(timeout=20)["worker"] == "det@amqp-r"
    assert app.tasks["emulated.plain"].delay(21).get(timeout=20) == 42
    # a queue no worker declared yet: the publish declares it (durable), nothing is dropped
    late = app.compass.queue_for("late@amqp-r")
    ids = _ghosts(app, late, 3)
    queues = app.compass.queues
    assert isinstance(queues, AmqpQueues)
    assert queues.counts(late) == (3, 0)
    ws.append(compass_workers("compass_celery.emulated_app", "late@amqp-r", *GPU,
                              env=_env(amqp_url, compass_redis_url)))
    wait_until(lambda: all(_ledger(compass_redis_url)[i] == 1 for i in ids), 30,
               "the late worker to run its queue", interval=0.1)
    assert queues.counts(late)[0] == 0


def test_sigterm_hands_back_and_every_task_runs_once(amqp_url, compass_redis_url,
                                                     compass_workers):
    names = ["g0@amqp-term", "g1@amqp-term"]
    app, ws = _cluster(amqp_url, compass_redis_url, compass_workers, names,
                       preload="captioner")
    results = _burst(app, 30, 150)
    on_g0 = [r for r in results if app.compass.placement(r.id).worker == names[0]]
    assert len(on_g0) >= 10, "the burst should queue work on both workers"
    wait_until(lambda: any(_ledger(compass_redis_url, keys.BENCH_STARTS)[r.id] for r in on_g0),
               20, "g0 to be running")
    ws[0].kill(signal.SIGTERM)  # a warm shutdown, as every deploy sends
    assert sorted(r.get(timeout=60)["data"] for r in results) == list(range(30)), \
        worker_logs(ws)
    runs = _ledger(compass_redis_url)
    assert sorted(runs) == sorted(r.id for r in results)
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    wait_until(lambda: not ws[0].alive(), 20, "g0 to exit")
    assert "handed back" in ws[0].log(), worker_logs(ws)
    assert app.compass.queues.counts(app.compass.queue_for(names[0]))[0] == 0


def test_sigkill_queue_is_drained_by_the_peer(amqp_url, compass_redis_url, compass_workers):
    names = ["k0@amqp-kill", "k1@amqp-kill"]
    app, ws = _cluster(amqp_url, compass_redis_url, compass_workers, names,
                       preload="captioner")
    results = _burst(app, 20, 200)
    on_k0 = [r for r in results if app.compass.placement(r.id).worker == names[0]]
    assert len(on_k0) >= 5
    wait_until(lambda: any(_ledger(compass_redis_url, keys.BENCH_STARTS)[r.id] for r in on_k0),
               20, "k0 to be running")
    ws[0].kill()  # SIGKILL mid-task: the broker returns its unacked message to its queue
    assert sorted(r.get(timeout=60)["data"] for r in results) == list(range(20)), \
        worker_logs(ws)
    finished = _ledger(compass_redis_url)
    started = _ledger(compass_redis_url, keys.BENCH_STARTS)
    assert all(finished[r.id] >= 1 for r in results)  # none lost
    duplicates = sum(n - 1 for n in finished.values() if n > 1)
    restarted = sum(n - 1 for n in started.values() if n > 1)
    print(f"duplicates {duplicates}, re-started {restarted}")
    # at least once: only what the killed worker held unacked (its prefetch) may run
    # again: the task it was running, and one it had finished but not yet acked
    assert duplicates <= 1 and restarted <= 2, (finished, started)
    queue = app.compass.queue_for(names[0])
    assert app.compass.queues.counts(queue) == (0, 0)
    assert "re-placed" in ws[1].log(), worker_logs(ws)


def test_same_name_restart_consumes_its_returned_task(amqp_url, compass_redis_url,
                                                      compass_workers):
    app, ws = _cluster(amqp_url, compass_redis_url, compass_workers, ["s0@amqp-same"])
    res = app.tasks["emulated.infer"].apply_async(("detector", 3000, "done"),
                                                  compass={"model": "detector",
                                                           "exec_ms": 3000})
    wait_until(lambda: _ledger(compass_redis_url, keys.BENCH_STARTS)[res.id] == 1, 15,
               "the task to start")
    ws[0].kill()  # SIGKILL mid-task; restarted at once under the same name
    ws.append(compass_workers("compass_celery.emulated_app", "s0@amqp-same", *GPU,
                              env=_env(amqp_url, compass_redis_url)))
    assert res.get(timeout=30)["data"] == "done", worker_logs(ws)
    assert _ledger(compass_redis_url, keys.BENCH_STARTS)[res.id] == 2  # killed run, and the rerun
    assert _ledger(compass_redis_url)[res.id] == 1


UNACKED_HOLDER = """
import sys, time
from kombu import Connection
with Connection(sys.argv[1]) as conn:
    ch = conn.channel()
    msg = ch.basic_get(sys.argv[2], no_ack=False)
    print("held" if msg is not None else "empty", flush=True)
    time.sleep(60)
"""


def test_unacked_message_returns_when_its_connection_dies(amqp_url, compass_redis_url):
    app = make_app(amqp_url, state_url=compass_redis_url)
    queue = app.compass.queue_for("holder@amqp-unacked")
    _ghosts(app, queue, 1)
    queues = app.compass.queues
    holder = subprocess.Popen([sys.executable, "-c", UNACKED_HOLDER, amqp_url, queue],
                              stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
    assert queues.counts(queue)[0] == 0  # in flight on the holder's connection
    holder.kill()  # no ack, no clean close
    holder.wait()
    wait_until(lambda: queues.counts(queue)[0] == 1, 10, "the broker to return it")


def test_drain_replaces_and_dead_letters_garbage(amqp_url, compass_redis_url):
    app = make_app(amqp_url, state_url=compass_redis_url, compass_heartbeat_timeout_s=1.0)
    queue = app.compass.queue_for("ghost@amqp-drain")
    ids = _ghosts(app, queue, 5)
    with app.producer_or_acquire() as producer:
        producer.publish(b"\xff not json at all", routing_key=queue, exchange="",
                         content_type="application/data", content_encoding="binary")
    queues = app.compass.queues
    assert queues.counts(queue)[0] == 6
    client = app.compass.store.client
    client.zadd(keys.key(keys.DEAD_QUEUES, "compass"), {queue: 0})  # as a stopped worker
    assert recover(app.compass, "drainer@amqp-drain", 1.0) == 5
    assert queues.counts(queue)[0] == 0
    assert queues.counts(app.compass.shared_queue)[0] == 5  # no live worker: shared queue
    dead = [json.loads(d) for d in client.lrange(queues.dead_letter_key, 0, -1)]
    assert len(dead) == 1 and dead[0]["queue"] == queue and "not a Celery" in dead[0]["reason"]
    moved = [client.get(queues.mark_key(f"{i}:0:0")) for i in ids]
    assert moved == [b"moved"] * 5


def _take_one(app, queue: str) -> AmqpQueues:
    """A second drainer (its own connection) that has taken the next message of ``queue``."""
    drainer = AmqpQueues(app, app.compass.store.client, "compass")
    drainer.stage([queue])
    assert drainer.next_staged(queue) is not None
    return drainer


def test_a_copy_already_moved_is_not_sent_again(amqp_url, compass_redis_url, monkeypatch):
    app = make_app(amqp_url, state_url=compass_redis_url)
    queue, target = (app.compass.queue_for(n) for n in ("from@amqp-mark", "to@amqp-mark"))
    _ghosts(app, queue, 1)
    first = _take_one(app, queue)
    raw = first.next_staged(queue)

    def lost(*args, **kwargs):
        raise ConnectionResetError("the drainer died before its ack")
    monkeypatch.setattr(type(first._chan()), "basic_ack", lost)
    with pytest.raises(ConnectionResetError):
        first.move(queue, raw, target, raw.decode())
    monkeypatch.undo()
    # the broker has the original back, and Redis says it was moved: acked, not re-sent
    wait_until(lambda: first.counts(queue)[0] == 1, 10, "the original back in its queue")
    second = AmqpQueues(app, app.compass.store.client, "compass")
    second.stage([queue])
    assert second.next_staged(queue) is None
    assert second.skipped == 1
    assert second.counts(queue)[0] == 0 and second.counts(target)[0] == 1


def test_a_copy_left_moving_is_sent_again(amqp_url, compass_redis_url, monkeypatch):
    """The one duplicate window: the broker confirmed, then the drainer died before
    Redis took the ``moved`` mark. The original is published again."""
    app = make_app(amqp_url, state_url=compass_redis_url)
    queue, target = (app.compass.queue_for(n) for n in ("from@amqp-win", "to@amqp-win"))
    _ghosts(app, queue, 1)
    first = _take_one(app, queue)
    raw = first.next_staged(queue)
    real_set = first.client.set

    def die_on_moved(key, value, **kw):
        if value == "moved":
            raise ConnectionResetError("the drainer died after the broker's confirm")
        return real_set(key, value, **kw)
    monkeypatch.setattr(first.client, "set", die_on_moved)
    with pytest.raises(ConnectionResetError):
        first.move(queue, raw, target, raw.decode())
    monkeypatch.undo()
    wait_until(lambda: first.counts(queue)[0] == 1, 10, "the original back in its queue")
    second = AmqpQueues(app, app.compass.store.client, "compass")
    second.stage([queue])
    again = second.next_staged(queue)
    assert again is not None
    assert second.move(queue, again, target, again.decode())
    assert second.counts(target)[0] == 2  # the duplicate the docs name


def test_worker_queues_work_without_missing_queues_on_rabbitmq(amqp_url, compass_redis_url,
                                                                compass_workers):
    """``task_create_missing_queues=False`` on the producer: compass hands Celery each
    worker queue's declaration, so routed tasks still reach the workers."""
    _, ws = _cluster(amqp_url, compass_redis_url, compass_workers,
                     ["m0@nomissing", "m1@nomissing"], preload="captioner")
    app = make_app(amqp_url, state_url=compass_redis_url, task_create_missing_queues=False,
                   compass_heartbeat_timeout_s=TIMEOUT_S, compass_snapshot_ttl_s=0.0)
    results = _burst(app, 4, 5.0)
    try:
        assert sorted(r.get(timeout=20)["data"] for r in results) == [0, 1, 2, 3]
    except Exception as exc:
        raise AssertionError(f"{exc!r}\n{worker_logs(ws)}") from None
    assert {app.compass.placement(r.id).worker for r in results} <= {"m0@nomissing",
                                                                     "m1@nomissing"}
