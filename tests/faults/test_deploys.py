"""Deploys with real processes: a warm shutdown (SIGTERM) hands its queue back."""

from __future__ import annotations

import signal
import time

import pytest

from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.faults.cluster import compass_keys_left, executions, start

pytestmark = pytest.mark.redis


def test_warm_shutdown_hands_back_its_queue(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["g0@deploy", "g1@deploy"])
    heavy = app.tasks["j.heavy"]  # 300 ms each on "big", which both hold
    results = [heavy.delay(i) for i in range(30)]
    on_g0 = [r for r in results if app.compass.placement(r.id).worker == "g0@deploy"]
    assert len(on_g0) >= 10, "the burst should queue work on both workers"
    time.sleep(0.5)
    ws[0].kill(signal.SIGTERM)  # a warm shutdown, as every deploy sends
    values = sorted(r.get(timeout=60) for r in results)
    assert values == list(range(30)), worker_logs(ws)
    runs = executions(app)
    assert sorted(runs) == sorted(r.id for r in results)
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    wait_until(lambda: not ws[0].alive(), 20, "g0 to exit")
    assert compass_keys_left(app, [app.compass.queue_for("g0@deploy")]) == {}
    assert "handed back" in ws[0].log(), worker_logs(ws)
