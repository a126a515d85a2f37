"""Plain (non-Dag) tasks behave as Dags do: the same call keywords, the same limits, the
same errors; and a send that fails is told apart by the exception's type."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from compass_celery import Compass, SendFailed


def _app(name: str, **conf: object) -> Celery:
    app = Celery(name, broker="memory://", backend="redis://127.0.0.1:1/0",
                 set_as_current=False)
    app.conf.update(compass_models={"m": 10.0}, **conf)
    Compass(app)
    return app


def _task(app: Celery, name: str = "p.t") -> object:
    @app.task(name=name, compass_model="m", compass_exec_ms=5, shared=False)
    def t(x: int = 0) -> int:
        return x

    return t


def test_send_failed_is_chosen_by_the_errors_type_not_its_text(monkeypatch) -> None:
    """The result store giving up on reconnecting (a RuntimeError raised from a connection
    error, whatever its words) is a SendFailed; a RuntimeError that merely mentions the
    result store, with no connection error behind it, is left as it is."""
    app = _app("sf")
    t = _task(app)

    def gave_up(*args: object, **kwargs: object) -> None:
        try:
            raise redis.ConnectionError("Connection refused")
        except redis.ConnectionError as exc:
            raise RuntimeError("reconnecting gave up; restart the app") from exc

    monkeypatch.setattr(app.backend, "on_task_call", gave_up)
    with pytest.raises(SendFailed, match="'p.t' was not sent.*Connection refused"):
        t.delay(1)

    def own_bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the result store hook has a bug")

    monkeypatch.setattr(app.backend, "on_task_call", own_bug)
    with pytest.raises(RuntimeError, match="hook has a bug") as err:
        t.delay(1)
    assert not isinstance(err.value, SendFailed)


@pytest.fixture
def eager_app(monkeypatch) -> Celery:
    """An eager app that fails the test on any network connection."""
    import socket

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("eager mode opened a network connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    app = _app("plain-eager", task_always_eager=True)
    _task(app)
    from compass_celery.testing import add_worker

    add_worker(app, "w0", gpu_mb=1600, resident=["m"])
    return app


def test_a_plain_task_takes_the_dags_slo_keywords_and_checks_them(eager_app) -> None:
    """``slo=``, ``deadline_ms=`` and ``on_miss=`` on a plain task are read as a Dag reads
    them (not passed on to Celery and ignored): a bad one is refused at the call."""
    from compass_celery.admission import SloInputError

    t = eager_app.tasks["p.t"]
    assert t.apply_async((3,), deadline_ms=400).get() == 3
    assert t.apply_async((4,), slo="interactive").get() == 4
    with pytest.raises(SloInputError, match="unknown SLO class 'nope'"):
        t.apply_async((1,), slo="nope")
    with pytest.raises(SloInputError, match="deadline"):
        t.apply_async((1,), deadline_ms=-5)
    with pytest.raises(SloInputError, match="on_miss"):
        t.apply_async((1,), deadline_ms=400, on_miss="shrug")
    with pytest.raises(SloInputError, match="deadline_ms given twice"):
        t.apply_async((1,), deadline_ms=400, compass={"deadline_ms": 300})


@pytest.mark.parametrize("level", [10, -1, "12"])
def test_a_priority_outside_0_to_9_is_refused_naming_it(eager_app, level: object) -> None:
    """Not clamped: the error names the value and the range, for a plain task and for a
    Dag (naming its node), whether the job's priority or a node's own."""
    from compass_celery import Dag

    t = eager_app.tasks["p.t"]
    with pytest.raises(ValueError, match=rf"priority {level!r} is outside 0\.\.9"):
        t.apply_async((1,), priority=level)
    dag = Dag(eager_app, "pri")
    dag.node("a", t.s(1))
    with pytest.raises(ValueError, match=rf"node 'a'.*priority {level!r} is outside 0\.\.9"):
        dag.apply_async(priority=level)
    own = Dag(eager_app, "own")
    own.node("b", t.s(1).set(priority=level))
    with pytest.raises(ValueError, match=rf"node 'b'.*priority {level!r} is outside 0\.\.9"):
        own.apply_async()
    assert t.apply_async((5,), priority=9).get() == 5
    assert t.apply_async((6,), priority="interactive").get() == 6


def test_a_plain_tasks_input_over_the_limit_is_refused_as_a_dags(eager_app) -> None:
    """``compass_max_input_kb`` bounds a plain task's arguments too (it bounded only a
    Dag's nodes: a 50 MB argument was taken and held a worker for a minute), with the
    same error, before anything runs; a Dag's node gets the same refusal."""
    from compass_celery import Dag
    from compass_celery.jobs.limits import JobInputTooLarge

    eager_app.conf.compass_max_input_kb = 1
    eager_app.compass.__dict__.pop("settings", None)
    t = eager_app.tasks["p.t"]
    big = "x" * 2048
    with pytest.raises(JobInputTooLarge, match=r"task 'p.t'.* 2 KB, over "
                       r"compass_max_input_kb=1: pass a reference"):
        t.delay(big)
    with pytest.raises(JobInputTooLarge, match="over compass_max_input_kb=1"):
        t.apply_async(kwargs={"x": big})
    assert t.delay("small").get() == "small"
    dag = Dag(eager_app, "big")
    dag.node("a", t.s(big))
    with pytest.raises(JobInputTooLarge, match="node 'a'.*over compass_max_input_kb=1"):
        dag.apply_async()


@pytest.mark.redis
def test_a_plain_task_over_the_input_limit_is_not_queued(compass_redis_url: str) -> None:
    """On a Redis broker the refusal comes before the send: nothing is queued."""
    from compass_celery.jobs.limits import JobInputTooLarge

    app = Celery("plain-big", broker=compass_redis_url, backend=compass_redis_url,
                 set_as_current=False)
    app.conf.update(compass_models={"m": 10.0}, compass_max_input_kb=1)
    Compass(app)
    t = _task(app, "p.big")
    client = redis.Redis.from_url(compass_redis_url)
    before = {k: client.llen(k) for k in client.keys("*") if client.type(k) == b"list"}
    try:
        with pytest.raises(JobInputTooLarge, match="task 'p.big'"):
            t.delay("x" * 4096)
        after = {k: client.llen(k) for k in client.keys("*") if client.type(k) == b"list"}
        assert after == before
    finally:
        app.compass.close()


def test_an_apps_own_request_class_is_kept_under_compasss() -> None:
    """An app whose Task names its own worker Request class keeps it: compass's request
    (DeadlineMissed for a task shed for its deadline) is mixed in, not put in its place."""
    from celery import Task
    from celery.worker.request import Request
    from kombu.utils.imports import symbol_by_name

    from compass_celery.task_class import CompassRequest

    class OwnRequest(Request):
        pass

    class OwnTask(Task):
        Request = OwnRequest

    app = Celery("own-request", broker="memory://", task_cls=OwnTask, set_as_current=False)
    Compass(app)
    t = _task(app, "p.own")
    used = symbol_by_name(t.Request)
    assert issubclass(used, OwnRequest) and issubclass(used, CompassRequest)
    plain = _task(_app("default-request"), "p.default")
    assert symbol_by_name(plain.Request) is CompassRequest
