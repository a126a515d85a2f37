"""The user's Celery settings are theirs: Compass(app) fills only what the app left unset.

Every route by which a Celery app gets a setting is exercised on a real Celery app
object (no broker is contacted): config_from_object (object and module, with and
without a namespace, before and after Compass(app), lazy or already loaded),
conf.update, Celery(**kwargs), add_defaults and the environment.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from compass_celery import Compass
from compass_celery.settings import (
    CELERY_RECOMMENDED,
    MISSING,
    SettingsError,
    recommend,
    refuse_pickle,
    user_value,
)

RECOMMENDED = {key: rec.value for key, rec in CELERY_RECOMMENDED.items()}


class DjangoSettings:
    """Like a Django settings module read with ``namespace="CELERY"``."""

    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 43200}
    CELERY_TASK_ACKS_LATE = False
    DEBUG = True


def new_app(**kwargs: Any) -> Celery:
    return Celery(f"t{uuid.uuid4().hex[:8]}", set_as_current=False, **kwargs)


def config_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """Write an importable celeryconfig-style module and return its name."""
    name = f"celeryconfig_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def assert_user_kept(app: Celery) -> None:
    """The two values from the reported Django case survive, the rest is recommended."""
    conf = app.conf
    assert conf.task_acks_late is False
    assert conf.broker_transport_options == {"visibility_timeout": 43200}
    # what the user left unset still gets compass's recommendation
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_reject_on_worker_lost is True


def compass_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "compass_celery"]


# -- routes ------------------------------------------------------------------------------

def test_django_pattern_namespace_object_before_compass() -> None:
    app = new_app()
    app.config_from_object(DjangoSettings, namespace="CELERY")
    Compass(app)
    assert_user_kept(app)


def test_namespace_object_loaded_before_compass() -> None:
    app = new_app()
    app.config_from_object(DjangoSettings, namespace="CELERY", force=True)
    assert app.configured
    Compass(app)
    assert_user_kept(app)


def test_config_from_object_after_compass_lazy() -> None:
    """Compass(app) first, configuration read later (the usual celery.py layout)."""
    app = new_app()
    Compass(app)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    assert not app.configured
    assert_user_kept(app)


def test_config_from_object_after_compass_on_a_loaded_app() -> None:
    """A reload of the configuration after Compass(app) is decided again, not lost."""
    app = new_app()
    Compass(app)
    assert app.conf.task_acks_late is True  # loads the configuration: nothing set yet
    app.config_from_object(DjangoSettings, namespace="CELERY")
    assert_user_kept(app)
    assert any(r is app.compass.router for r in app.conf.task_routes)


def test_module_by_name_without_namespace(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    name = config_module(tmp_path, monkeypatch,
                         "task_acks_late = False\n"
                         "broker_transport_options = {'visibility_timeout': 43200}\n")
    app = new_app()
    app.config_from_object(name)
    Compass(app)
    assert_user_kept(app)


def test_old_style_setting_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery 3 names (CELERY_ACKS_LATE, CELERYD_PREFETCH_MULTIPLIER) are user values too."""
    name = config_module(tmp_path, monkeypatch,
                         "CELERY_ACKS_LATE = False\nCELERYD_PREFETCH_MULTIPLIER = 4\n")
    app = new_app()
    app.config_from_object(name)
    Compass(app)
    assert app.conf.task_acks_late is False
    assert app.conf.worker_prefetch_multiplier == 4


def test_conf_update_before_configuration() -> None:
    app = new_app()
    app.conf.update(task_acks_late=False,
                    broker_transport_options={"visibility_timeout": 43200})
    Compass(app)
    assert_user_kept(app)


def test_conf_update_on_a_loaded_app() -> None:
    app = new_app()
    _ = app.conf.task_serializer
    app.conf.update(task_acks_late=False,
                    broker_transport_options={"visibility_timeout": 43200})
    Compass(app)
    assert_user_kept(app)


def test_celery_keyword_arguments() -> None:
    app = new_app(task_acks_late=False,
                  broker_transport_options={"visibility_timeout": 43200})
    Compass(app)
    assert_user_kept(app)


def test_add_defaults_layer_is_the_apps() -> None:
    app = new_app()
    app.add_defaults({"task_acks_late": False,
                      "broker_transport_options": {"visibility_timeout": 43200}})
    Compass(app)
    assert_user_kept(app)


def test_config_from_envvar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = config_module(tmp_path, monkeypatch,
                         "task_acks_late = False\n"
                         "broker_transport_options = {'visibility_timeout': 43200}\n")
    monkeypatch.setenv("MYAPP_CELERY_CONFIG", name)
    app = new_app()
    app.config_from_envvar("MYAPP_CELERY_CONFIG")
    Compass(app)
    assert_user_kept(app)


def test_broker_url_from_environment_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://env-host:6390/3")
    app = new_app()
    compass = Compass(app)
    assert app.conf.broker_url == "redis://env-host:6390/3"
    assert compass.redis_url == "redis://env-host:6390/3"


def test_a_value_equal_to_celerys_default_is_still_the_users() -> None:
    """worker_prefetch_multiplier=4 is Celery's default; set explicitly, it is kept."""
    app = new_app(worker_prefetch_multiplier=4)
    Compass(app)
    assert app.conf.worker_prefetch_multiplier == 4


# -- recommendations apply only where nothing was set ------------------------------------

def test_recommendations_apply_when_the_user_set_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    app = new_app()
    with caplog.at_level(logging.INFO, logger="compass_celery"):
        Compass(app)
        for key, value in RECOMMENDED.items():
            assert app.conf[key] == value, key
    assert app.conf.worker_prefetch_multiplier == 1  # Celery's own default is 4
    assert compass_lines(caplog) == []


def test_transport_options_are_merged() -> None:
    app = new_app(broker_transport_options={"master_name": "mymaster"})
    Compass(app)
    assert app.conf.broker_transport_options == {"master_name": "mymaster",
                                                 "visibility_timeout": 3600}


def test_recommended_dict_is_not_shared_between_apps() -> None:
    first, second = new_app(), new_app()
    Compass(first)
    Compass(second)
    first.conf.broker_transport_options["visibility_timeout"] = 1
    assert second.conf.broker_transport_options == {"visibility_timeout": 3600}
    assert CELERY_RECOMMENDED["broker_transport_options"].value == {
        "visibility_timeout": 3600}


# -- the log line ------------------------------------------------------------------------

def test_one_line_per_kept_difference(caplog: pytest.LogCaptureFixture) -> None:
    app = new_app(task_acks_late=False)
    with caplog.at_level(logging.INFO, logger="compass_celery"):
        Compass(app)
        assert app.conf.task_acks_late is False  # the configuration loads (and logs) here
    lines = compass_lines(caplog)
    assert len(lines) == 1
    line = lines[0]
    assert "task_acks_late=False" in line
    assert "recommends True" in line
    assert CELERY_RECOMMENDED["task_acks_late"].why in line
    assert "\n" not in line


def test_transport_option_difference_names_the_key(
        caplog: pytest.LogCaptureFixture) -> None:
    app = new_app()
    app.config_from_object(DjangoSettings, namespace="CELERY")
    with caplog.at_level(logging.INFO, logger="compass_celery"):
        Compass(app)
        _ = app.conf.task_acks_late
    lines = compass_lines(caplog)
    assert len(lines) == 2
    vt = [line for line in lines if "visibility_timeout" in line]
    assert len(vt) == 1
    assert "broker_transport_options['visibility_timeout']=43200" in vt[0]
    assert "recommends 3600" in vt[0]


def test_no_line_when_the_user_agrees(caplog: pytest.LogCaptureFixture) -> None:
    app = new_app(task_acks_late=True, accept_content=("json",),
                  broker_transport_options={"visibility_timeout": 3600},
                  worker_prefetch_multiplier=4)
    with caplog.at_level(logging.INFO, logger="compass_celery"):
        Compass(app)
        assert app.conf.task_acks_late is True  # the configuration loads here
    lines = compass_lines(caplog)
    assert len(lines) == 1 and "worker_prefetch_multiplier=4" in lines[0]
    caplog.clear()
    app = new_app(task_acks_late=True, accept_content=("json",),
                  broker_transport_options={"visibility_timeout": 3600})
    with caplog.at_level(logging.INFO, logger="compass_celery"):
        Compass(app)
        _ = app.conf.task_acks_late
    assert compass_lines(caplog) == []


# -- the pure decision -------------------------------------------------------------------

def test_recommend_reads_and_writes_nothing() -> None:
    app = new_app(task_acks_late=False)
    conf = app.conf
    _ = conf.task_serializer
    before = dict(conf.changes)
    to_apply, differences = recommend(conf)
    assert dict(conf.changes) == before
    assert "task_acks_late" not in to_apply
    assert to_apply["worker_prefetch_multiplier"] == 1
    assert [d.setting for d in differences] == ["task_acks_late"]


def test_recommend_on_a_plain_mapping() -> None:
    to_apply, differences = recommend({"accept_content": ["json", "msgpack"],
                                       "broker_transport_options": None})
    assert "accept_content" not in to_apply
    assert to_apply["broker_transport_options"] == {"visibility_timeout": 3600}
    assert [(d.setting, d.user, d.recommended) for d in differences] == [
        ("accept_content", ["json", "msgpack"], ["json"])]


def test_user_value_ignores_celerys_builtin_defaults() -> None:
    app = new_app()
    assert app.conf.worker_prefetch_multiplier == 4  # Celery's default, loads the conf
    assert user_value(app.conf, "worker_prefetch_multiplier") is MISSING
    app.conf.worker_prefetch_multiplier = 4
    assert user_value(app.conf, "worker_prefetch_multiplier") == 4


# -- pickle is refused everywhere --------------------------------------------------------

PICKLE_CT = "application/x-python-serialize"


@pytest.mark.parametrize(("setting", "value"), [
    ("task_serializer", "pickle"),
    ("result_serializer", "pickle"),
    ("event_serializer", "pickle"),
    ("task_serializer", PICKLE_CT),
    ("accept_content", ["json", "pickle"]),
    ("accept_content", ["json", PICKLE_CT]),
    ("result_accept_content", ["json", "pickle"]),
    ("result_accept_content", [PICKLE_CT]),
])
def test_pickle_is_refused_naming_the_setting(setting: str, value: Any) -> None:
    app = new_app(**{setting: value})
    with pytest.raises(SettingsError, match=rf"^{setting}\b.*pickle"):
        _ = Compass(app).settings


def test_pickle_refused_when_loaded_through_a_namespace() -> None:
    class Conf:
        CELERY_RESULT_ACCEPT_CONTENT = [PICKLE_CT]

    app = new_app()
    app.config_from_object(Conf, namespace="CELERY")
    with pytest.raises(SettingsError, match="result_accept_content"):
        _ = Compass(app).settings


def test_other_serializers_are_not_refused() -> None:
    refuse_pickle({"task_serializer": "msgpack", "event_serializer": "json",
                   "accept_content": ["json", "application/x-msgpack"],
                   "result_accept_content": None})
    app = new_app(accept_content=["json", "msgpack"])
    assert Compass(app).settings["policy"] == "compass"


@pytest.mark.parametrize(("broker", "aware"), [("redis://127.0.0.1:1/0", True),
                                               ("amqp://guest:guest@127.0.0.1:1//", False)])
def test_placement_is_batch_aware_only_where_workers_can_batch(broker: str, aware: bool):
    # a RabbitMQ worker runs each batched input alone: planning joins there would
    # charge each input one input's share of a batch that never forms
    app = Celery(f"batch-{uuid.uuid4().hex}", broker=broker, set_as_current=False)
    Compass(app)
    assert app.compass.settings["batch_aware"] is aware
