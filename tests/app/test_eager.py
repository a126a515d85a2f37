"""Eager mode: the same placement decisions with no Redis at all."""

from __future__ import annotations

import socket

import pytest
from celery import Celery

from compass_celery import Compass, PlacementError
from compass_celery.state.store import MemoryStateStore
from compass_celery.testing import add_worker


@pytest.fixture
def eager_app(monkeypatch):
    # Any attempt to open a socket (to Redis or anything else) fails the test.
    def no_network(*args, **kwargs):
        raise AssertionError("eager mode opened a network connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    app = Celery("eager", broker="redis://127.0.0.1:1/0")
    app.conf.task_always_eager = True
    app.conf.compass_models = {"captioner": 950, "detector": 250, "translator": 300}
    compass = Compass(app)

    @app.task(shared=False, name="t.caption", compass_model="captioner", compass_exec_ms=120)
    def caption(text):
        return text.upper()

    @app.task(shared=False, name="t.detect", compass_model="detector", compass_exec_ms=30)
    def detect(n):
        return n + 1

    @app.task(shared=False, name="t.plain")
    def plain(x):
        return -x

    add_worker(compass.app, "cap", gpu_mb=1600, resident=["captioner"])
    add_worker(compass.app, "det", gpu_mb=1600, resident=["detector", "translator"])
    return app


def test_eager_results_and_placements_without_redis(eager_app):
    compass = eager_app.compass
    assert isinstance(compass.store, MemoryStateStore)
    r1 = eager_app.tasks["t.caption"].delay("hello")
    r2 = eager_app.tasks["t.detect"].delay(41)
    assert r1.get() == "HELLO" and r2.get() == 42
    assert compass.placement(r1.id).worker == "cap"
    assert compass.placement(r2.id).worker == "det"
    assert eager_app.tasks["t.plain"].delay(3).get() == -3
    assert compass.placement(eager_app.tasks["t.plain"].delay(1).id) is None


def test_eager_busy_worker_loses_like_redis_mode(eager_app):
    compass = eager_app.compass
    add_worker(compass.app, "cap", gpu_mb=1600, resident=["captioner"], backlog_ms=2000)
    res = eager_app.tasks["t.caption"].delay("x")
    placed = compass.placement(res.id)
    assert placed.worker == "det"
    assert placed.load_ms == pytest.approx(950 / 1500 * 1000)
    # backlog charged while running is released afterwards
    snap = compass.store.snapshot(10**12, 10**13)
    assert {w.name: w.backlog_ms for w in snap.workers} == {"cap": 2000, "det": 0}


def test_eager_unknown_model_is_named(eager_app):
    @eager_app.task(shared=False, name="t.bad", compass_model="nope")
    def bad():
        return 1

    with pytest.raises(PlacementError, match="unknown model 'nope'"):
        bad.delay().get()


def test_eager_model_larger_than_every_gpu_is_named(eager_app):
    eager_app.conf.compass_models["giant"] = 50_000

    @eager_app.task(shared=False, name="t.giant", compass_model="giant")
    def giant():
        return 1

    eager_app.compass.__dict__.pop("settings", None)
    with pytest.raises(PlacementError, match="giant"):
        giant.delay().get()


def test_eager_without_workers_records_fallback():
    app = Celery("eager2")
    app.conf.task_always_eager = True
    app.conf.compass_models = {"m": 10}
    compass = Compass(app)

    @app.task(shared=False, name="t.m", compass_model="m")
    def m():
        return "ok"

    res = m.delay()
    assert res.get() == "ok"
    assert compass.placement(res.id).fallback


@pytest.mark.parametrize("how", ["reset", "close"])
def test_reset_forgets_the_eager_workers_of_an_earlier_test(eager_app, how):
    """An app built once (a module's ``app``) and declared on by test after test: without
    a reset the earlier test's workers stay and win the placement."""
    compass = eager_app.compass
    first = eager_app.tasks["t.caption"].delay("a")  # an earlier test: placed on "cap"
    assert compass.placement(first.id).worker == "cap"
    getattr(compass, how)()
    add_worker(eager_app, "cpu9", gpu_mb=1600)  # the next test's only worker
    res = eager_app.tasks["t.caption"].delay("b")
    assert res.get() == "B"
    assert compass.placement(res.id).worker == "cpu9"
    assert [w.name for w in compass.store.snapshot(10**12, 10**13).workers] == ["cpu9"]
    assert compass.placement(first.id) is None
