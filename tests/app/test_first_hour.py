"""A new user's ordinary mistakes and mode switches, each with one clear answer."""

from __future__ import annotations

import logging
import time

import pytest
from celery import Celery

from compass_celery import Compass, CompassInputError
from compass_celery.planner.types import WorkerView
from compass_celery.settings import SettingsError, recommend
from compass_celery.state.store import MemoryStateStore, RedisStateStore
from compass_celery.testing import add_worker


def _app(**conf: object) -> Celery:
    app = Celery("first", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(compass_models={"m": 100.0}, **conf)
    return app


def test_pickle_is_refused_once_at_compass_app_with_no_keeping_warning(caplog) -> None:
    app = _app(task_serializer="pickle")
    assert app.conf.task_serializer == "pickle"  # the app is configured before Compass(app)
    with caplog.at_level(logging.WARNING, logger="compass_celery"), \
            pytest.raises(SettingsError, match="task_serializer='pickle'"):
        Compass(app)
    assert "keeping your Celery setting task_serializer" not in caplog.text


def test_a_set_and_a_list_with_the_same_members_are_the_same_setting() -> None:
    _, differences = recommend({"accept_content": {"json"}})
    assert [d.setting for d in differences if d.setting == "accept_content"] == []
    _, differences = recommend({"accept_content": ["json", "yaml"]})
    assert [d.setting for d in differences if d.setting == "accept_content"]


def test_compass_after_the_tasks_are_bound_says_to_call_it_first() -> None:
    app = _app()

    @app.task(name="first.t", shared=False, compass_model="m", compass_exec_ms=10)
    def t(x: int) -> int:
        return x

    assert t.name == "first.t"  # binds the task, finalizing the app
    with pytest.raises(CompassInputError, match=r"before.*first\.t"):
        Compass(app)


def test_the_refusal_names_only_this_apps_tasks() -> None:
    """Celery binds another app's shared ``@app.task`` into this one when it finalizes:
    that task is not this app's mistake, so the refusal names only this app's own."""
    from celery import _state

    shared_before = set(_state._on_app_finalizers)
    try:
        other = _app()
        Compass(other)

        @other.task(name="first.others", compass_model="m", compass_exec_ms=10)  # shared
        def others() -> int:
            return 1

        assert others.name == "first.others"
        app = _app()

        @app.task(name="first.mine", shared=False, compass_model="m", compass_exec_ms=10)
        def mine() -> int:
            return 2

        assert "first.others" in app.tasks  # finalized: the shared task is bound here too
        with pytest.raises(CompassInputError, match=r"already: first\.mine\. Call") as err:
            Compass(app)
        assert "first.others" not in str(err.value)
    finally:  # later apps in this process must not inherit it
        _state._on_app_finalizers.intersection_update(shared_before)


def test_a_plain_task_bound_before_compass_is_fine() -> None:
    app = _app()

    @app.task(name="first.plain", shared=False)
    def plain() -> int:
        return 1

    assert plain.name == "first.plain"
    Compass(app)  # no compass options on it: nothing to place, nothing to refuse


@pytest.mark.redis
def test_switching_eager_off_again_uses_redis(compass_redis_url) -> None:
    app = _app(compass_redis_url=compass_redis_url, broker_url=compass_redis_url)
    Compass(app)

    @app.task(name="first.placed", shared=False, compass_model="m", compass_exec_ms=10)
    def placed() -> int:
        return 1

    app.conf.task_always_eager = True
    add_worker(app, "gpu0", gpu_mb=1000)
    assert isinstance(app.compass.store, MemoryStateStore)
    res = placed.delay()
    assert app.compass.placement(res.id).worker == "gpu0"

    app.conf.task_always_eager = False
    placed.delay()  # sent, not run: compass follows the switch
    assert isinstance(app.compass.store, RedisStateStore)
    other = RedisStateStore(compass_redis_url, app.compass.settings["key_prefix"])
    other.publish(WorkerView(name="real@w", queue=app.compass.queue_for("real@w"),
                             gpu_total_mb=1000, gpu_free_mb=1000, heartbeat=time.time()))
    app.compass.reader.invalidate()
    assert [w.name for w in app.compass.reader.get().workers] == ["real@w"]


def test_a_dag_node_naming_an_unknown_model_is_refused_when_it_is_added() -> None:
    """Celery binds an ``@app.task`` in every app of the process (shared tasks), so a
    task is refused where it is used with this app: ``Dag.node`` (and ``delay()``)."""
    from compass_celery import Dag, DagValidationError

    app = _app(task_always_eager=True)
    Compass(app)

    @app.task(name="first.typo", compass_model="m-typo", compass_exec_ms=10, shared=False)
    def typo() -> int:
        return 1

    dag = Dag(app, "typos")
    with pytest.raises(DagValidationError, match=r"'x'.*'m-typo'.*compass_models"):
        dag.node("x", typo.s())
    assert not dag.nodes


def test_a_dag_cannot_be_given_a_cycle() -> None:
    from compass_celery import Dag, DagValidationError

    app = _app(task_always_eager=True)
    Compass(app)

    @app.task(name="first.step", compass_model="m", compass_exec_ms=10, shared=False)
    def step(*args: object) -> int:
        return 1

    dag = Dag(app, "loops")
    with pytest.raises(DagValidationError, match="after itself.*cycle"):
        dag.node("a", step.s(), after=["a"])
    assert "a" not in dag.nodes  # refused whole: nothing half-added
    dag.node("a", step.s())
    dag.node("b", step.s(), after=["a"])
    with pytest.raises(DagValidationError, match="'b' -> 'a'.*cycle"):
        dag.edge("b", "a")
    with pytest.raises(DagValidationError, match="missing node 'c'.*already added.*cycle"):
        dag.node("d", step.s(), after=["c"])
