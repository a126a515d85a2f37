"""``app.control.purge()`` discards the tasks waiting in compass's queues, with a real worker
and redis-server. Celery purges only its configured queues, and a worker's own queue
(``compass.w.<hostname>``) is never among them: before the fix, purge() returned 0 and every
placed task still ran (Celery's integration suite waits on a purge between canvases)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.cluster import compass_keys_left, executions, start, wait_started

pytestmark = pytest.mark.redis


def test_purge_discards_what_waits_in_a_workers_own_queue(compass_redis_url: str,
                                                         compass_workers: Any) -> None:
    app, ws = start(compass_redis_url, compass_workers, ["w1@purge"])
    wait = app.tasks["j.wait"]
    busy = wait.delay(0, 2.0)
    wait_started(app, busy)  # what is sent next waits behind it
    waiting = [wait.delay(i, 0.0) for i in range(1, 7)]
    queue = app.compass.queue_for("w1@purge")
    assert {app.compass.placement(r.id).queue for r in waiting} == {queue}
    assert compass_keys_left(app, [queue]), "nothing waits in the worker's queue"

    purged = app.control.purge()

    assert purged >= len(waiting) - 1  # the solo worker may hold one it fetched already
    assert not compass_keys_left(app, [queue, app.compass.shared_queue])
    assert busy.get(timeout=20) == 0
    time.sleep(1.0)  # the worker is free: a task left anywhere would start now
    ran = executions(app)
    assert sum(ran[r.id] for r in waiting) <= 1, ran


def test_purge_reaches_the_shared_queue_and_celerys_own(compass_redis_url: str) -> None:
    """No worker is live: compass's tasks fall back to the shared queue, a plain task goes to
    Celery's default queue; one purge empties both and counts both."""
    from tests.support.jobapp import make_app

    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)

    @app.task(name="j.plain", shared=False)
    def plain() -> None:
        """A task without compass options: Celery routes it."""

    app.log = app.compass.store.client  # what compass_keys_left reads
    app.tasks["j.wait"].delay(0, 0.0)
    app.tasks["j.wait"].delay(1, 0.0)
    plain.delay()
    assert compass_keys_left(app, [app.compass.shared_queue])
    assert app.control.purge() == 3
    assert not compass_keys_left(app, [app.compass.shared_queue, "celery"])
