"""Arrivals counted in Redis by the submitting side and read by an autoscaler controller
(state/arrivals.py): each job counted once under its SLO class, admitted or refused, in
the transaction that records it; read back once each, late writes included; and the
controller's rate is what the producers submitted, not what its own process saw."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from compass_celery import Dag
from compass_celery.cli.common import load
from compass_celery.emulated import make_app
from compass_celery.errors import Rejected
from compass_celery.planner.types import WorkerView
from compass_celery.providers import Autoscaler
from compass_celery.state import keys
from compass_celery.state.arrivals import (
    ARRIVAL_KEY_S,
    ARRIVAL_TTL_S,
    ArrivalCounter,
    arrivals_key,
    bucket_of,
    count_arrival,
)

pytestmark = pytest.mark.redis
M = "captioner"


def _totals(polls: list[tuple[str, float, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for cls, _, n in polls:
        out[cls] = out.get(cls, 0) + n
    return out


def test_each_arrival_is_read_once_late_writes_included(compass_redis_url: str) -> None:
    r = redis.Redis.from_url(compass_redis_url)
    now = [1_000_000.25]
    counter = ArrivalCounter(r, "arr", wall=lambda: now[0])
    for _ in range(3):
        count_arrival(r, "arr", "interactive", now[0])
    count_arrival(r, "arr", "standard", now[0])
    first = counter.poll()
    assert _totals(first) == {"interactive": 3, "standard": 1}
    assert all(0.0 <= age <= 1.0 for _, age, _ in first)
    assert counter.poll() == []  # nothing new: nothing handed out twice
    now[0] += 2.0
    count_arrival(r, "arr", "interactive", now[0])
    count_arrival(r, "arr", "interactive", now[0] - 2.0)  # late, into a bucket already read
    again = counter.poll()
    assert _totals(again) == {"interactive": 2}
    # each in the middle of its bucket's stretch since the last poll: the current
    # bucket's first quarter second, the late one's bucket after the last poll
    assert sorted(age for _, age, _ in again) == [pytest.approx(0.125),
                                                  pytest.approx(1.625)]
    ttl = r.ttl(arrivals_key("arr", bucket_of(now[0])))
    assert 0 < ttl <= ARRIVAL_TTL_S  # buckets expire on their own


@pytest.mark.parametrize("phase", [0.0, 0.3, 0.55, 0.8])
def test_a_stretch_between_polls_reads_what_arrived_in_it(compass_redis_url: str,
                                                           phase: float) -> None:
    """Read every 3 s, the arrivals of the last 3, 6 and 12 s are exactly those that came
    in them, whatever the phase of the second buckets' edges against the polls. Placed at
    their bucket's middle, a poll in a bucket's second half read 5.5 s of arrivals as the
    last 6 s (the controller's up-fast test looks that far back), one in its first half
    6.5 s."""
    r = redis.Redis.from_url(compass_redis_url)
    prefix, base = f"arrs{int(phase * 100)}", 5_000_000.0 + phase
    now = [base]
    counter = ArrivalCounter(r, prefix, wall=lambda: now[0])
    assert counter.poll() == []
    times = [base + 0.05 + 0.1 * i for i in range(300)]  # 10 a second for 30 s
    placed: list[tuple[float, int]] = []
    for k in range(1, 11):
        for t in times[30 * (k - 1):30 * k]:
            count_arrival(r, prefix, "interactive", t)
        now[0] = base + 3.0 * k
        placed += [(now[0] - age, n) for _, age, n in counter.poll()]
    assert [t for t, _ in placed] == sorted(t for t, _ in placed)  # in time order
    for span in (3.0, 6.0, 12.0):
        got = sum(n for t, n in placed if t >= now[0] - span)
        assert got == sum(1 for t in times if t > now[0] - span) == 10 * span


def test_a_minute_lost_from_redis_gets_its_ttl_again(compass_redis_url: str) -> None:
    """A minute's hash that Redis lost (a restart without persistence, a failover, another
    server under the same prefix) and that this process writes again still expires: no
    process remembers a TTL as already set."""
    r = redis.Redis.from_url(compass_redis_url)
    now = 4_000_000.5
    key = arrivals_key("arrl", bucket_of(now))
    count_arrival(r, "arrl", "interactive", now)
    r.delete(key)
    count_arrival(r, "arrl", "interactive", now + 1.0)
    assert 0 < r.ttl(key) <= ARRIVAL_TTL_S
    assert r.hgetall(key) == {f"{bucket_of(now + 1.0)}:interactive".encode(): b"1"}


def test_a_new_controller_reads_back_its_window(compass_redis_url: str) -> None:
    r = redis.Redis.from_url(compass_redis_url)
    now = 2_000_000.0
    for s in range(60):
        count_arrival(r, "arr", "interactive", now - s - 0.5)
    restarted = ArrivalCounter(r, "arr", backfill_s=30.0, wall=lambda: now)
    assert _totals(restarted.poll()) == {"interactive": 30}  # the last 30 s
    assert _totals(ArrivalCounter(r, "arr", wall=lambda: now).poll()) == {}


def test_a_minute_of_arrivals_is_one_key_with_a_ttl(compass_redis_url: str) -> None:
    """Two minutes of arrivals, one a second: two hashes (not 120 keys), each expiring;
    a reader started after them reads every second's count back, at its own age."""
    r = redis.Redis.from_url(compass_redis_url)
    start = 3_000_000.0  # a minute's first second (3_000_000 = 50_000 x 60)
    for s in range(2 * ARRIVAL_KEY_S):
        count_arrival(r, "arrm", "interactive", start + s + 0.5)
        if s % 2:
            count_arrival(r, "arrm", "standard", start + s + 0.5)
    made = sorted(r.scan_iter(match="{arrm}:arrivals:*"))
    assert made == sorted(arrivals_key("arrm", bucket_of(start + m * ARRIVAL_KEY_S)).encode()
                          for m in range(2))
    assert all(0 < r.ttl(k) <= ARRIVAL_TTL_S for k in made)
    assert r.hlen(made[0]) == ARRIVAL_KEY_S + ARRIVAL_KEY_S // 2  # a field per second, class
    now = start + 2 * ARRIVAL_KEY_S
    polls = ArrivalCounter(r, "arrm", backfill_s=90.0, wall=lambda: now).poll()
    assert _totals(polls) == {"interactive": 90, "standard": 45}  # the last 90 s only
    assert min(age for _, age, _ in polls) == pytest.approx(0.5)
    assert max(age for _, age, _ in polls) == pytest.approx(89.5)
    with pytest.raises(ValueError, match="backfill_s"):
        ArrivalCounter(r, "arrm", backfill_s=float(ARRIVAL_TTL_S))


@pytest.fixture
def producer(compass_redis_url: str) -> Iterator[Any]:
    """A producing app and one worker record (nothing consumes: the jobs wait queued)."""
    app = make_app(compass_redis_url, state_url=compass_redis_url, compass_snapshot_ttl_s=0.0,
                   compass_key_prefix="arrp", compass_heartbeat_timeout_s=3600.0)
    c = app.compass
    c.store.publish(WorkerView(name="x@arr", queue=c.queue_for("x@arr"), gpu_total_mb=4000,
                               gpu_free_mb=1000, resident=frozenset({M}),
                               heartbeat=time.time()))
    yield app
    c.close()


def _job(app: Any, name: str) -> Dag:
    dag = Dag(app, name)
    dag.node("a", app.tasks["emulated.infer"].s(M, 200.0, 0), model=M, exec_ms=200.0)
    return dag


def test_submitted_jobs_are_counted_per_class_admitted_or_refused(producer: Any) -> None:
    r = redis.Redis.from_url(producer.conf.broker_url)
    counter = ArrivalCounter(r, "arrp", backfill_s=60.0)
    for i in range(4):
        _job(producer, f"ok{i}").apply_async(slo="interactive", deadline_ms=60_000)
    _job(producer, "plain").apply_async()
    for i in range(2):
        with pytest.raises(Rejected):  # 200 ms of work cannot end within 5 ms
            _job(producer, f"late{i}").apply_async(slo="interactive", deadline_ms=5)
    assert _totals(counter.poll()) == {"interactive": 6, "none": 1}
    # admitted jobs were counted beside their deadline: 5 jobs in the deadline set
    assert r.zcard(keys.key(keys.JOB_DEADLINES, "arrp")) == 5


def test_counting_can_be_turned_off(compass_redis_url: str) -> None:
    app = make_app(compass_redis_url, state_url=compass_redis_url, compass_snapshot_ttl_s=0.0,
                   compass_key_prefix="arroff", compass_count_arrivals=False)
    try:
        _job(app, "quiet").apply_async(slo="interactive", deadline_ms=60_000)
        r = redis.Redis.from_url(compass_redis_url)
        assert list(r.scan_iter(match="{arroff}:arrivals:*")) == []
    finally:
        app.compass.close()


class _Nobody:
    """A provider with no workers to start (the test watches the rate, not the fleet)."""

    def names(self) -> list[str]:
        return []

    def add(self, preload: Any = ()) -> str:
        return ""

    def remove(self, name: str) -> None:
        pass


def test_the_controller_sizes_from_what_producers_submitted(producer: Any) -> None:
    """Jobs submitted by a producer the controller never hears from directly: its tick
    reads their count from Redis, and asks for the workers that rate needs."""
    r = redis.Redis.from_url(producer.conf.broker_url)
    workload = load("autoscale-mix")
    scaler = Autoscaler(_Nobody(), workload, lambda: [], window_s=10.0, down_window_s=5.0,
                        horizon_s=2.0, gpu_mb=4000.0, clock=time.monotonic,
                        arrivals=ArrivalCounter(r, "arrp", backfill_s=10.0))
    idle = scaler.tick()
    for i in range(40):
        _job(producer, f"j{i}").apply_async(slo="interactive", deadline_ms=60_000)
    busy = scaler.tick()
    assert scaler.counted == {"interactive": 40}
    rate, _ = scaler.window.rates(scaler.clock())["interactive"]
    assert rate > 0 and busy.need.work_workers > idle.need.work_workers
