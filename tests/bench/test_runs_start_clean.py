"""Each benchmark run starts from nothing its policy's previous run left in Redis: the
learned run times, load times and plan error, the worker records and the job records
(all under the ``{prefix}`` hash tag) as well as the queues (``prefix.*``). A sweep
runs one policy many times on one Redis; a plan error learned at an overloaded rate
must not make admission refuse every job of the next run."""

from __future__ import annotations

import pytest
import redis

from compass_celery.bench.runner import _forget_previous_run
from compass_celery.state import keys

pytestmark = pytest.mark.redis


def test_a_run_forgets_its_policys_state_and_keeps_others(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    mine, other = "compass-bench-compass", "compass-bench-jsq"
    for prefix in (mine, other):
        client.hset(keys.key(keys.PLAN_ERRORS, prefix), "interactive", 900.0)
        client.hset(keys.key(keys.WORKERS, prefix), "w0", "{}")
        client.rpush(f"{prefix}.w.w0", "message")
    _forget_previous_run(client, client, mine)
    assert not client.exists(keys.key(keys.PLAN_ERRORS, mine), keys.key(keys.WORKERS, mine),
                             f"{mine}.w.w0")
    assert client.exists(keys.key(keys.PLAN_ERRORS, other), keys.key(keys.WORKERS, other),
                         f"{other}.w.w0") == 3
