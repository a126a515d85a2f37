"""The atomic fetch (fetch.lua) and what recovery reads of it, against a real Redis."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from compass_celery.broker.fetch import _fetch_script
from compass_celery.broker.kombu_redis import RedisLayout, RedisQueues

pytestmark = pytest.mark.redis

QUEUE, SHARED = "compass.w.f0", "compass.shared"


def _message(queue: str, task_id: str | None = None) -> str:
    tid = task_id or uuid.uuid4().hex
    return json.dumps({"body": "W10=", "headers": {"task": "j.src", "id": tid},
                       "properties": {"delivery_tag": tid, "priority": 0, "delivery_info":
                                      {"exchange": "", "routing_key": queue}}})


def _fetch(client: redis.Redis, queues: RedisQueues, lists: list[str]) -> list[bytes] | None:
    return client.eval(_fetch_script(), 4 + len(lists), "unacked", "unacked_index",
                       queues.leases_key, queues.fetch_key(QUEUE), *lists, "1.0")


def test_a_fetched_message_is_in_flight_and_leased_in_the_same_step(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    low, high = layout.list_for(QUEUE, 9), layout.list_for(QUEUE, 0)
    client.lpush(low, _message(QUEUE, "low"))
    client.lpush(high, _message(QUEUE, "high"))
    src, raw = _fetch(client, queues, layout.lists(QUEUE))
    assert src.decode() == high and json.loads(raw)["headers"]["id"] == "high"  # kombu's order
    entry = json.loads(client.hget("unacked", "high"))
    assert entry[1:] == ["", QUEUE] and entry[0]["headers"]["id"] == "high"
    assert client.zscore("unacked_index", "high") == 1.0
    assert client.zscore(queues.leases_key, "high") is not None
    client.lpush(queues.fetch_key(QUEUE), _message(QUEUE, "moved"))  # what a wait moved
    assert json.loads(_fetch(client, queues, layout.lists(QUEUE))[1])["headers"]["id"] == "moved"
    assert json.loads(_fetch(client, queues, layout.lists(QUEUE))[1])["headers"]["id"] == "low"
    assert _fetch(client, queues, layout.lists(QUEUE)) is None


def test_a_dead_queues_drain_takes_its_fetch_list(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues = RedisQueues(client, RedisLayout(), "compass")
    client.lpush(queues.fetch_key(QUEUE), _message(QUEUE, "moved"))
    assert queues.has_work(QUEUE)
    assert queues.stage([QUEUE], 1.0) == {QUEUE: (1, 0)}
    assert json.loads(queues.next_staged(QUEUE))["headers"]["id"] == "moved"


def test_the_shared_queue_gives_up_only_lapsed_leases(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues = RedisQueues(client, RedisLayout(), "compass")
    client.lpush(SHARED, _message(SHARED, "waiting"))
    for tag in ("lapsed", "live", "unleased"):
        client.hset("unacked", tag, json.dumps([json.loads(_message(SHARED, tag)), "", SHARED]))
    now = float(client.time()[0])
    client.zadd(queues.leases_key, {"lapsed": now - 60, "live": now + 1})
    assert queues.stage([SHARED], 5.0, in_flight_only=True) == {SHARED: (1, 1)}
    assert json.loads(queues.next_staged(SHARED))[0]["headers"]["id"] == "lapsed"
    assert client.llen(SHARED) == 1  # live workers consume what waits there
    assert {t.decode() for t in client.hkeys("unacked")} == {"live", "unleased"}
