"""``Compass(app)`` cleans up after itself: no process-wide receiver kept per app, no
thread until a task needs placing, and ``close()`` releases what it started."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from celery import Celery, signals

from compass_celery import Compass

pytestmark = pytest.mark.redis


def _live_receivers() -> int:
    """Receivers of before_task_publish still alive (Celery prunes dead weak ones lazily)."""
    return sum(1 for _, ref in signals.before_task_publish.receivers
               if not isinstance(ref, weakref.ReferenceType) or ref() is not None)


def _compass_threads() -> int:
    return sum(t.name.startswith("compass-") for t in threading.enumerate())


def _app(i: int, url: str) -> Celery:
    app = Celery(f"cleanup{i}", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    app.conf.update(compass_redis_url=url, compass_models={"m": 10.0})
    Compass(app)

    @app.task(name=f"cleanup{i}.plain", shared=False)
    def plain() -> int:
        return 1

    @app.task(name=f"cleanup{i}.placed", shared=False, compass_model="m", compass_exec_ms=5)
    def placed() -> int:
        return 1

    return app


def test_dropped_apps_leave_no_receivers_and_plain_tasks_start_no_thread(compass_redis_url):
    gc.collect()
    receivers, threads = _live_receivers(), _compass_threads()
    for i in range(20):
        app = _app(i, compass_redis_url)
        app.tasks[f"cleanup{i}.plain"].delay()
        del app
    gc.collect()
    assert _compass_threads() == threads  # nothing to place: nothing started
    assert _live_receivers() == receivers


def test_close_releases_the_threads_a_placed_task_started(compass_redis_url):
    threads = _compass_threads()
    apps = [_app(100 + i, compass_redis_url) for i in range(5)]
    for i, app in enumerate(apps):
        app.tasks[f"cleanup{100 + i}.placed"].delay()
    assert _compass_threads() > threads
    for app in apps:
        app.compass.close()
    for t in [t for t in threading.enumerate() if t.name.startswith("compass-")]:
        t.join(timeout=5)
    assert _compass_threads() == threads
