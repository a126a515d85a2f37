"""The one retry policy for Redis hiccups: jittered backoff within bounds, the give-up
time, ``done`` giving back the step's result, and errors no retry can fix raised at once
(a Dag sent with a wrong password fails fast with :class:`SendFailed`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoPermissionError,
    ReadOnlyError,
    ResponseError,
)

from compass_celery.errors import RetriesExhausted, SendFailed
from compass_celery.jobs import retry
from compass_celery.jobs.dag import Dag
from compass_celery.jobs.retry import NOT_DONE, RetryPolicy, done_if, retry_transient
from compass_celery.local import RedisServer
from compass_celery.state.connection import StateUnavailable


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry loop's sleeps, recorded instead of slept."""
    out: list[float] = []  # (this module's clock only: other threads keep sleeping)
    monkeypatch.setattr(retry, "time", SimpleNamespace(monotonic=time.monotonic,
                                                       sleep=out.append))
    return out


@pytest.fixture
def seeded() -> Iterator[Callable[[int], None]]:
    """Seed the module ``random`` redis-py's backoff draws from; restored afterwards."""
    state = random.getstate()
    yield random.seed
    random.setstate(state)


class Failing:
    """A step that raises ``exc`` ``times`` times, then returns ``result``; counts calls."""

    def __init__(self, times: int, exc: BaseException, result: Any = "ok") -> None:
        self.times, self.exc, self.result, self.calls = times, exc, result, 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise self.exc
        return self.result


def test_two_seeds_give_different_delays_each_within_its_exponential_bounds(
        sleeps: list[float], seeded: Callable[[int], None]) -> None:
    """Workers that lost Redis together must not retry in lockstep: the delays are
    jittered, each within [d/2, d] of the capped doubling d."""
    runs = []
    for seed in (1, 2):
        seeded(seed)
        sleeps.clear()
        assert retry_transient("x", Failing(6, redis.ConnectionError("away")), give_up_s=60,
                               delay_s=0.1, max_delay_s=1.0) == "ok"
        runs.append(list(sleeps))
    assert runs[0] != runs[1]
    for delays in runs:
        assert len(delays) == 6
        for n, delay in enumerate(delays):
            cap = min(1.0, 0.1 * 2 ** n)
            assert cap / 2 <= delay <= cap, (n, delay)


def test_the_policy_delays_are_redis_py_backoff_and_reproducible_under_one_seed(
        seeded: Callable[[int], None]) -> None:
    policy = RetryPolicy(give_up_s=5, delay_s=0.2, max_delay_s=2.0)
    assert isinstance(policy.backoff(), redis.backoff.EqualJitterBackoff)
    seeded(7)
    first = [d for d, _ in zip(policy.delays(), range(8), strict=False)]
    seeded(7)
    assert first == [d for d, _ in zip(policy.delays(), range(8), strict=False)]
    assert max(first) <= 2.0 and min(first) >= 0.1


def test_the_give_up_time_is_kept() -> None:
    started = time.monotonic()
    step = Failing(10**6, redis.ConnectionError("away"))
    with pytest.raises(RetriesExhausted, match="unavailable for 0.3s"):
        retry_transient("x", step, give_up_s=0.3, delay_s=0.05, max_delay_s=0.1)
    assert 0.3 <= time.monotonic() - started < 1.0
    assert step.calls > 2


def test_done_gives_back_the_steps_result_when_its_reply_was_lost(sleeps: list[float]) -> None:
    """A step that took effect although its reply was lost returns its result, not True:
    a caller charging what it sent must see what was sent."""
    step = Failing(1, redis.ConnectionError("reply lost"))
    assert retry_transient("x", step, give_up_s=5, done=lambda: {"sent": 1}) == {"sent": 1}
    assert step.calls == 1  # not run twice


def test_done_not_done_runs_the_step_again(sleeps: list[float]) -> None:
    step = Failing(2, redis.TimeoutError("slow"), result=42)
    assert retry_transient("x", step, give_up_s=5, done=lambda: NOT_DONE) == 42
    assert step.calls == 3
    assert retry_transient("x", Failing(1, OSError("reset")), give_up_s=5,
                           done=done_if(lambda: True, "kept")) == "kept"


def test_a_yes_no_done_is_refused_rather_than_taken_for_a_result(sleeps: list[float]) -> None:
    with pytest.raises(TypeError, match="NOT_DONE"):
        retry_transient("x", Failing(1, redis.ConnectionError("x")), give_up_s=5,
                        done=lambda: True)


@pytest.mark.parametrize("exc", [
    AuthenticationError("invalid username-password pair"),
    NoPermissionError("NOPERM this user has no permissions to run the 'hset' command"),
    ResponseError("ERR Error running script"),
    StateUnavailable("Redis unavailable"),  # wrapping a refusal (set below)
])
def test_errors_no_retry_can_fix_are_raised_at_once(sleeps: list[float],
                                                    exc: BaseException) -> None:
    if isinstance(exc, StateUnavailable):
        exc.__cause__ = AuthenticationError("WRONGPASS")
    step = Failing(10**6, exc)
    with pytest.raises(type(exc)):
        retry_transient("x", step, give_up_s=5, errors=(redis.RedisError, OSError,
                                                         StateUnavailable))
    assert step.calls == 1 and sleeps == []


@pytest.mark.parametrize("exc", [
    BusyLoadingError("Redis is loading the dataset in memory"),
    ReadOnlyError("You can't write against a read only replica."),
    ResponseError("BUSY Redis is busy running a script."),
    redis.ConnectionError("Connection refused"),
])
def test_busy_loading_and_failover_replies_are_retried(sleeps: list[float],
                                                      exc: BaseException) -> None:
    step = Failing(2, exc)
    assert retry_transient("x", step, give_up_s=5, errors=(redis.RedisError, OSError)) == "ok"
    assert len(sleeps) == 2


@pytest.mark.redis
def test_submit_charges_a_source_whose_send_reply_was_lost(compass_redis_url: str,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The source's message went out but its reply was lost: the retry finds it queued
    and must still charge its worker (once), as a send that answered would."""
    from compass_celery.planner.types import WorkerView
    from tests.support.jobapp import make_app

    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0,
                   compass_key_prefix="lostreply", compass_heartbeat_timeout_s=3600.0)
    c = app.compass
    c.store.publish(WorkerView(name="x@lost", queue=c.queue_for("x@lost"), gpu_total_mb=4000,
                               gpu_free_mb=1000, resident=frozenset({"big"}),
                               heartbeat=time.time()))
    real, lost = app.send_task, []

    def send_then_lose_the_reply(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if not lost:
            lost.append(kwargs["task_id"])
            raise redis.ConnectionError("Connection reset by peer (reply lost)")
        return result

    monkeypatch.setattr(app, "send_task", send_then_lose_the_reply)
    dag = Dag(app, "lost-reply")
    dag.node("a", app.tasks["j.heavy"].s(1))
    handle = dag.apply_async()
    assert lost == [f"{handle.id}.a"]
    backlog = {w.name: w.backlog_ms for w in c.store.snapshot(time.time(), 3.0).workers}
    assert backlog["x@lost"] == pytest.approx(300.0)  # charged, once
    assert c.placement(lost[0]).worker == "x@lost"  # and remembered, as a send answered
    assert len(c.queues.peek(c.queue_for("x@lost"))) == 1  # sent once


@pytest.mark.redis
@pytest.mark.parametrize("acl", [
    (["--requirepass", "right"], "redis://:wrong@127.0.0.1:{port}/0", "AuthenticationError"),
    (["--user", "default", "off", "--user", "compass", "on", ">pw", "~*", "&*", "+@all",
      "-hset"], "redis://compass:pw@127.0.0.1:{port}/0", "NoPermissionError"),
])
def test_a_dag_redis_refuses_fails_fast_with_send_failed(
        compass_redis_server: RedisServer, acl: tuple[list[str], str, str]) -> None:
    """A wrong password (or an ACL without a command the submission needs) is not a
    hiccup: the Dag fails with the SendFailed a plain task raises, at once, naming the
    cause, not after submit_retry_s of retries."""
    from tests.support.jobapp import make_app

    args, url, cause = acl
    with RedisServer(args=args) as server:
        app = make_app(url.format(port=server.port))
        dag = Dag(app, "refused")
        a = dag.node("a", app.tasks["j.src"].s(1))
        dag.node("b", app.tasks["j.add"].s(1), after=[a])
        started = time.monotonic()
        with pytest.raises(SendFailed) as err:
            dag.apply_async()
        assert time.monotonic() - started < 2.0
    message = str(err.value)
    assert "'refused'" in message and "not sent" in message and cause in message
    assert ":wrong@" not in message and ":pw@" not in message


def test_a_dag_redis_never_answered_fails_with_send_failed_after_its_retries() -> None:
    """Redis away for the whole of ``compass_submit_retry_s`` before the job was recorded:
    nothing was written or sent, so the Dag fails with the SendFailed a plain task
    raises (naming the job and the URL, password masked), not RetriesExhausted."""
    from compass_celery.local import free_port
    from tests.support.jobapp import make_app

    app = make_app(f"redis://:secret@127.0.0.1:{free_port()}/0", compass_submit_retry_s=0.5)
    dag = Dag(app, "away")
    dag.node("a", app.tasks["j.src"].s(1))
    started = time.monotonic()
    with pytest.raises(SendFailed) as err:
        dag.apply_async()
    assert time.monotonic() - started < 2.0
    message = str(err.value)
    assert "'away'" in message and "not sent" in message and "0.5 s" in message
    assert "secret" not in message and "***" in message
    assert isinstance(err.value.__cause__, RetriesExhausted)
