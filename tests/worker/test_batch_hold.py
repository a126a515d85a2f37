"""When a real worker holds a forming batch open, by the simulator's rule
(``planner.batch.hold_until_ms``): never past the leader's own latest start, counted from
the first input's sending rather than its pick, and not at all while other work waits;
the hold blocks on the queue's lists and ends on the first push of other work."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from compass_celery.local import wait_until
from compass_celery.placement import Decision
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live
from tests.support.holdapp import HOLD_MS, SHORT_HOLD_MS, make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "small"]
#: What a pass may start after the moment the rule says start: settling its members.
SLACK_S = 0.3


def _worker(url: str, compass_workers: Any, name: str) -> tuple[Any, str, Any]:
    """A worker running ``tests.support.holdapp``, the app, and the worker's queue."""
    w = compass_workers("tests.support.holdapp", name, *GPU, env={"COMPASS_BROKER_URL": url})
    app = make_app(url, compass_snapshot_ttl_s=0.0)
    wait_live(app, 1, [w])
    app.log = redis.Redis.from_url(url)
    return app, app.compass.destination(app.compass.queue_for(name)), w


def _send(app: Any, task: str, arg: Any, queue: str, **placed: Any) -> Any:
    """Send to ``queue`` with a compass header sent now (``placed`` overrides fields)."""
    decision = Decision(task=task, model="small", worker="", queue=queue, policy="test",
                        charge_ms=0.0, queued_at=time.time())
    header = {**decision.as_header(), **placed}
    return app.tasks[task].apply_async((arg,), queue=queue, headers={"compass": header})


def _log(app: Any, key: str) -> list[Any]:
    return [json.loads(x) for x in app.log.lrange(key, 0, -1)]


def _held(app: Any, w: Any, results: dict[str, Any]) -> dict[str, Any]:
    """The one pass the batched ``results`` (by input) ran in, once each has its own."""
    assert {x: r.get(timeout=20) for x, r in results.items()} == \
        {x: f"e({x})" for x in results}, worker_logs([w])
    [held] = _log(app, "held")
    return held


def _batched(app: Any, task: str, queue: str, *inputs: str) -> dict[str, Any]:
    return {x: _send(app, task, x, queue) for x in inputs}


def test_a_batch_never_starts_past_its_leaders_latest_start(compass_redis_url,
                                                            compass_workers):
    app, queue, w = _worker(compass_redis_url, compass_workers, "h1@hold")
    busy = _send(app, "h.busy", 0.5, queue)  # the inputs queue up behind it
    t0 = time.time()
    lead = _send(app, "h.embed", "lead", queue, expires_at=t0 + 1.5)  # a member without
    mate = _send(app, "h.embed", "mate", queue)                      # one may wait 3 s
    held = _held(app, w, {"lead": lead, "mate": mate})
    assert held["xs"] == ["lead", "mate"]
    assert held["t"] <= t0 + 1.5 + SLACK_S < t0 + HOLD_MS / 1000, (held, t0)
    assert busy.get(timeout=5) <= held["t"]


def test_the_hold_counts_from_the_first_inputs_sending_not_its_pick(compass_redis_url,
                                                                    compass_workers):
    """The inputs waited behind a busy task longer than ``max_wait_ms``: they start the
    moment the worker is free."""
    app, queue, w = _worker(compass_redis_url, compass_workers, "h2@hold")
    busy = _send(app, "h.busy", SHORT_HOLD_MS / 1000 + 0.4, queue)
    held = _held(app, w, _batched(app, "h.embed_short", queue, "a", "b"))
    free = busy.get(timeout=5)
    assert held["xs"] == ["a", "b"]
    assert held["t"] - free < SLACK_S < SHORT_HOLD_MS / 1000, (held, free)


def test_other_work_waiting_closes_the_batch_at_once(compass_redis_url, compass_workers):
    app, queue, w = _worker(compass_redis_url, compass_workers, "h3@hold")
    busy = _send(app, "h.busy", 0.5, queue)
    rs = _batched(app, "h.embed", queue, "c1", "c2")
    other = app.tasks["j.src"].apply_async((7,), queue=queue)  # not a member
    held = _held(app, w, rs)
    free = busy.get(timeout=5)
    assert held["xs"] == ["c1", "c2"]
    assert held["t"] - free < SLACK_S < HOLD_MS / 1000, (held, free)
    assert other.get(timeout=20) == 7


def test_work_sent_to_another_priority_list_mid_hold_ends_it_at_once(compass_redis_url,
                                                                     compass_workers):
    """The hold blocks on every list of the queue (one per priority step), so the first
    push of other work wakes it, whichever list it lands on."""
    app, queue, w = _worker(compass_redis_url, compass_workers, "h4@hold")
    busy = _send(app, "h.busy", 0.3, queue)
    rs = _batched(app, "h.embed", queue, "d1", "d2")
    busy.get(timeout=20)
    # holding: the leader taken, its mate claimed, nothing left waiting
    wait_until(lambda: app.log.hlen("unacked") == 2 and app.compass.queues.waiting(queue) == 0
               and not _log(app, "held"), 10, "the batch to hold")
    sent = time.time()
    other = app.tasks["j.src"].apply_async((8,), queue=queue, priority=9)
    held = _held(app, w, rs)
    assert held["xs"] == ["d1", "d2"]
    assert held["t"] - sent < SLACK_S < HOLD_MS / 1000, (held, sent)
    assert other.get(timeout=20) == 8


def _calls(client: Any, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_holding_batch_blocks_instead_of_polling(compass_redis_url, compass_workers):
    """About a second of hold costs a few commands (one BLMOVE per list), not a claim
    script every millisecond."""
    app, queue, w = _worker(compass_redis_url, compass_workers, "h5@hold")
    busy = _send(app, "h.busy", 0.3, queue)
    t0 = time.time()
    rs = {"p1": _send(app, "h.embed", "p1", queue, expires_at=t0 + 1.5),
          "p2": _send(app, "h.embed", "p2", queue)}
    busy.get(timeout=20)
    wait_until(lambda: app.log.hlen("unacked") == 2 and app.compass.queues.waiting(queue) == 0
               and not _log(app, "held"), 10, "the batch to hold")
    before = _calls(app.log, "evalsha"), _calls(app.log, "blmove")
    held = _held(app, w, rs)
    scripts, watches = _calls(app.log, "evalsha") - before[0], _calls(app.log, "blmove") - before[1]
    assert held["t"] - t0 > 1.0  # it did hold, about a second
    assert scripts < 100 and watches >= 1, (scripts, watches)


def test_the_list_watch_wakes_on_any_list_and_consumes_nothing(compass_redis_url):
    """Straight on Redis: a push to the queue's last priority list wakes a watch of all
    of them at once, and stays where it was; with nothing pushed, the watch ends on its
    own clock (Redis would end it on its 100 ms tick), leaving no client blocked."""
    import threading

    from compass_celery.broker.kombu_redis import RedisLayout, RedisQueues

    client = redis.Redis.from_url(compass_redis_url, socket_timeout=2.0)
    queues = RedisQueues(client, RedisLayout(), "compass")
    last = RedisLayout().lists("q")[-1]
    client.lpush(last, "old")  # a watch finds what is already there at once
    assert queues.wait_for_arrival("q", 5.0) is True
    client.delete(last)
    pusher = threading.Timer(0.2, lambda: client.lpush(last, "new"))
    pusher.start()
    t0 = time.monotonic()
    assert queues.wait_for_arrival("q", 5.0) is True
    assert 0.15 < time.monotonic() - t0 < 1.0
    assert client.lrange(last, 0, -1) == [b"new"]
    client.delete(last)
    t0 = time.monotonic()
    assert queues.wait_for_arrival("q", 0.01) is False
    assert time.monotonic() - t0 < 0.08
    wait_until(lambda: client.info("clients")["blocked_clients"] == 0, 5,
               "the watches to end")


def test_a_member_past_its_deadline_ends_with_deadline_missed(compass_redis_url,
                                                              compass_workers):
    """A batched input dropped unrun for the deadline compass gave it raises
    DeadlineMissed from ``result.get()``, as a plain task's does, not Celery's
    ``TaskRevokedError('expired')``; its mates run."""
    from compass_celery.errors import DeadlineMissed

    app, queue, w = _worker(compass_redis_url, compass_workers, "h6@hold")
    busy = _send(app, "h.busy", 0.6, queue)
    t0 = time.time()
    lead = _send(app, "h.embed", "lead", queue)
    late = _send(app, "h.embed", "late", queue, expires_at=t0 + 0.2, due=t0 + 0.3)
    assert busy.get(timeout=20) is not None
    assert lead.get(timeout=20) == "e(lead)", worker_logs([w])
    with pytest.raises(DeadlineMissed) as err:
        late.get(timeout=20)
    assert err.value.info["task_id"] == late.id and late.state == "REVOKED"
