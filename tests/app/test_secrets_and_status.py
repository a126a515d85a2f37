"""No password in any message that names a URL, and ``compass status --json``."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
from celery import Celery
from click.testing import CliRunner

from compass_celery import Compass
from compass_celery.cli import compass_command
from compass_celery.planner.types import WorkerView
from compass_celery.state.connection import StateUnavailable
from compass_celery.state.store import RedisStateStore
from compass_celery.state.urls import masked

SECRET = "s3cret-pw"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bad_url() -> str:
    return f"redis://user:{SECRET}@127.0.0.1:{_closed_port()}/0"


@pytest.mark.parametrize("url", [
    f"redis://:{SECRET}@h:6379/0", f"rediss://user:{SECRET}@h:6380/1",
    f"sentinel://:{SECRET}@h1:26379;sentinel://:{SECRET}@h2:26379",
    f"redis+cluster://u:{SECRET}@h1:7000,h2:7001", f"amqp://guest:{SECRET}@h:5672/vh",
])
def test_masked_hides_every_password(url: str) -> None:
    out = masked(url)
    assert SECRET not in out and "***" in out
    assert masked("redis://h:6379/0") == "redis://h:6379/0"


def test_an_unreachable_state_redis_error_names_the_url_without_its_password() -> None:
    store = RedisStateStore(_bad_url(), "compass")
    with pytest.raises(StateUnavailable) as err:
        store.snapshot(time.time(), 5.0)
    assert SECRET not in str(err.value) and "127.0.0.1" in str(err.value)


def test_the_routing_fallback_warning_has_no_password(caplog) -> None:
    app = Celery("sec", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(compass_redis_url=_bad_url(), compass_models={"m": 10.0})
    Compass(app)

    @app.task(name="sec.t", shared=False, compass_model="m", compass_exec_ms=5)
    def t() -> int:
        return 1

    with caplog.at_level(logging.WARNING, logger="compass_celery"):
        t.delay()
    assert "shared queue" in caplog.text and SECRET not in caplog.text


def test_status_on_an_unreachable_redis_shows_no_password() -> None:
    result = CliRunner().invoke(compass_command, ["status", "--redis", _bad_url()])
    assert result.exit_code != 0
    assert "unavailable" in result.output and SECRET not in result.output


@pytest.mark.redis
def test_status_json_lists_the_live_workers(compass_redis_url) -> None:
    store = RedisStateStore(compass_redis_url, "compass")
    store.publish(WorkerView(name="gpu0@h", queue="compass.w.gpu0@h", gpu_total_mb=1600,
                             gpu_free_mb=600, resident=frozenset({"m"}), heartbeat=time.time(),
                             loading={"big": (time.time(), time.time() + 2.0)}))
    table = CliRunner().invoke(compass_command, ["status", "--redis", compass_redis_url])
    assert "m (loading big)" in table.output, table.output
    result = CliRunner().invoke(compass_command, ["status", "--redis", compass_redis_url,
                                                  "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [w["name"] for w in body["workers"]] == ["gpu0@h"]
    worker = body["workers"][0]
    assert worker["resident"] == ["m"] and worker["gpu_free_mb"] == 600
    assert worker["loading"] == ["big"]
    assert body["skipped"] == [] and "redis" in body and "settings" in body


@pytest.mark.redis
def test_status_shows_refusals_per_slo_class_and_cause(compass_redis_url) -> None:
    store = RedisStateStore(compass_redis_url, "compass")
    for slo, cause in [("interactive", "deadline"), ("interactive", "cold"),
                       ("interactive", "deadline"), ("none", "queue_full")]:
        store.count_refusal(slo, cause)
    assert store.refusals() == {"interactive": {"deadline": 2, "cold": 1},
                                "none": {"queue_full": 1}}
    table = CliRunner().invoke(compass_command, ["status", "--redis", compass_redis_url])
    assert table.exit_code == 0, table.output
    rows = [line.split() for line in table.output.splitlines()]
    assert ["interactive", "cold", "1"] in rows and ["interactive", "deadline", "2"] in rows
    assert ["none", "queue_full", "1"] in rows
    body = json.loads(CliRunner().invoke(compass_command, ["status", "--redis",
                                                           compass_redis_url, "--json"]).output)
    assert body["refusals"] == {"interactive": {"deadline": 2, "cold": 1},
                                "none": {"queue_full": 1}}


def test_the_memory_store_counts_refusals_the_same_way() -> None:
    from compass_celery.state.store import MemoryStateStore

    store = MemoryStateStore()
    assert store.refusals() == {}
    store.count_refusal("batch", "queue_full")
    store.count_refusal("batch", "queue_full")
    assert store.refusals() == {"batch": {"queue_full": 2}}


def test_the_settings_table_masks_a_state_url() -> None:
    from compass_celery.settings import describe, resolve

    rows = dict((name, value) for name, value, _ in
                describe(resolve({"compass_redis_url": f"redis://:{SECRET}@h:6379/0"})))
    assert SECRET not in rows["compass_redis_url"] and "***" in rows["compass_redis_url"]


def test_a_wrong_redis_at_delay_fails_fast_with_one_error_naming_it() -> None:
    """Broker and result backend unreachable: ``delay()`` raises within seconds (not after
    Celery's 19 s of result-store retries), naming the URL without its password, and
    nothing was queued (the result store is subscribed before the message is sent)."""
    from compass_celery import SendFailed

    url = _bad_url()
    app = Celery("sec2", broker=url, backend=url, set_as_current=False)
    app.conf.update(compass_models={"m": 10.0})
    Compass(app)

    @app.task(name="sec2.t", compass_model="m", compass_exec_ms=5, shared=False)
    def t() -> int:
        return 1

    started = time.monotonic()
    with pytest.raises(SendFailed) as err:
        t.delay()
    assert time.monotonic() - started < 8
    message = str(err.value)
    assert "'sec2.t'" in message and "not sent" in message
    assert "127.0.0.1" in message and SECRET not in message
