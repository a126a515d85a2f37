"""The benchmark's waiter times each job's answer when it arrives, on a real Redis."""

from __future__ import annotations

import time

import redis

from compass_celery.bench.runner import _Waiter
from compass_celery.results import JobOutcome


def test_a_job_watched_while_the_waiter_blocks_is_timed_when_its_answer_arrives(
    compass_redis_url: str,
) -> None:
    client = redis.Redis.from_url(compass_redis_url)
    clock = lambda: time.monotonic() * 1000.0  # noqa: E731
    waiter = _Waiter(redis.Redis.from_url(compass_redis_url), clock)
    waiter.start()
    try:
        slow, quick = JobOutcome(0, "a", clock()), JobOutcome(1, "a", clock())
        waiter.watch("done:slow", slow)  # never answered: the BLPOP blocks on it alone
        time.sleep(0.05)
        waiter.watch("done:quick", quick)  # watched while that BLPOP waits
        time.sleep(0.02)
        answered = clock()
        client.rpush("done:quick", b"SUCCESS")
        deadline = time.monotonic() + 2.0
        while quick.end_ms is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert quick.end_ms is not None and not quick.failed
        # seen as it arrived, not at the BLPOP's 0.2 s timeout
        assert quick.end_ms - answered < 50.0
        assert slow.end_ms is None
    finally:
        waiter.stopping.set()
        waiter.join(2.0)
