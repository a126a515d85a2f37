"""The worker's look at its own queue: next message first, as kombu will deliver them."""

from __future__ import annotations

import json

import pytest
import redis

from compass_celery.placement import Decision
from compass_celery.worker.bootstep import peek_queue

pytestmark = pytest.mark.redis


def message(model: str) -> str:
    d = Decision(task="t", model=model, worker="w", queue="q", policy="compass", charge_ms=5)
    return json.dumps({"body": "", "headers": {"task": "t", "compass": d.as_header()},
                       "properties": {"delivery_info": {"routing_key": "q"}}})


def test_peek_returns_the_next_messages_in_delivery_order(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    for model in ["m1", "m2", "m3", "m4", "m5"]:  # published in this order
        client.lpush("q", message(model))
    client.lpush("q", b"{garbage")
    assert [d.model for d in peek_queue(client, "q", 3)] == ["m1", "m2", "m3"]
    assert [d.model for d in peek_queue(client, "q")] == ["m1", "m2", "m3", "m4", "m5"]
    # and it is what a consumer really gets next
    assert json.loads(client.rpop("q"))["headers"]["compass"]["model"] == "m1"
