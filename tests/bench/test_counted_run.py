"""The benchmark's execution ledger around an emulated run, against a real Redis."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from compass_celery import emulated
from compass_celery.state import keys

pytestmark = pytest.mark.redis


def _task(task_id: str) -> SimpleNamespace:
    settings = SimpleNamespace(key_prefix="ledger-test")
    return SimpleNamespace(request=SimpleNamespace(id=task_id),
                           app=SimpleNamespace(compass=SimpleNamespace(settings=settings)))


def test_a_run_counts_its_start_and_end_in_one_round_trip(compass_redis_url, monkeypatch):
    """The start is in Redis while the run runs (a worker killed mid-run is counted as
    started), both counts are in when it returns, and the run's own errors pass through
    with its start counted and no execution."""
    monkeypatch.setenv("COMPASS_BENCH_LEDGER_URL", compass_redis_url)
    monkeypatch.setattr(emulated, "_ledger_client", None)
    log = redis.Redis.from_url(compass_redis_url)
    starts, execs = (keys.key(t, "ledger-test") for t in (keys.BENCH_STARTS, keys.BENCH_EXECS))
    log.delete(starts, execs)
    seen = []

    def run() -> str:
        seen.append(log.hget(starts, "t1"))  # another connection, during the run
        return "out"

    log.config_resetstat()
    assert emulated.counted(_task("t1"), run) == "out"
    assert seen == [b"1"]
    assert log.hget(starts, "t1") == b"1" and log.hget(execs, "t1") == b"1"
    assert log.info("commandstats")["cmdstat_hincrby"]["calls"] == 2

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError):
        emulated.counted(_task("t2"), boom)
    assert log.hget(starts, "t2") == b"1" and log.hget(execs, "t2") is None
    assert emulated.counted(_task("t3"), run) == "out"  # the connection started over
    assert log.hget(execs, "t3") == b"1"
    log.delete(starts, execs)
