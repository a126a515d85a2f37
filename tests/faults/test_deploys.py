"""Deploys with real processes: a warm shutdown (SIGTERM) hands its queue back."""

from __future__ import annotations

import signal

import pytest

from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, compass_keys_left, executions, start

pytestmark = pytest.mark.redis


def test_warm_shutdown_hands_back_its_queue(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["g0@deploy", "g1@deploy"])
    heavy = app.tasks["j.heavy"]  # 300 ms each on "big", which both hold
    results = [heavy.delay(i) for i in range(30)]
    on_g0 = [r for r in results if app.compass.placement(r.id).worker == "g0@deploy"]
    assert len(on_g0) >= 10, "the burst should queue work on both workers"
    wait_until(lambda: any(executions(app)[r.id] for r in on_g0), 20, "g0 to be running")
    ws[0].kill(signal.SIGTERM)  # a warm shutdown, as every deploy sends
    values = sorted(r.get(timeout=60) for r in results)
    assert values == list(range(30)), worker_logs(ws)
    runs = executions(app)
    assert sorted(runs) == sorted(r.id for r in results)
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    wait_until(lambda: not ws[0].alive(), 20, "g0 to exit")
    assert compass_keys_left(app, [app.compass.queue_for("g0@deploy")]) == {}
    assert "handed back" in ws[0].log(), worker_logs(ws)


def test_rolling_restart_of_every_worker_loses_nothing_runs_nothing_twice(
        compass_redis_url, compass_workers):
    names = ["r0@deploy", "r1@deploy", "r2@deploy"]
    app, ws = start(compass_redis_url, compass_workers, names)
    heavy = app.tasks["j.heavy"]
    results = [heavy.delay(i) for i in range(12)]
    for i, name in enumerate(names):  # a deploy: stop each worker, start its successor
        results += [heavy.delay(100 * (i + 1) + k) for k in range(6)]
        ws[i].stop(timeout=30)  # SIGTERM, wait for a clean exit
        ws[i] = compass_workers("tests.support.jobapp", name, *GPU,
                                env={"COMPASS_BROKER_URL": compass_redis_url,
                                     "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"})
    values = sorted(r.get(timeout=90) for r in results)
    assert len(values) == len(results), worker_logs(ws)
    runs = executions(app)
    assert sorted(runs) == sorted(r.id for r in results)
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    assert compass_keys_left(app, [app.compass.queue_for(n) for n in names]) == {}


def test_same_name_restart_takes_back_its_in_flight_task(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["s0@deploy"])
    res = app.tasks["j.wait"].delay("done", 3.0)
    wait_until(lambda: executions(app)[res.id] == 1, 15, "the task to start")
    ws[0].kill()  # SIGKILL mid-task; restarted at once under the same name (compose does)
    ws.append(compass_workers("tests.support.jobapp", "s0@deploy", *GPU,
                              env={"COMPASS_BROKER_URL": compass_redis_url,
                                   "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}))
    # without a take-back it would wait for kombu's visibility timeout (an hour)
    assert res.get(timeout=30) == "done", worker_logs(ws)
    assert executions(app)[res.id] == 2  # the killed run, and the one that finished
    assert "took back 1 task(s)" in ws[1].log()
