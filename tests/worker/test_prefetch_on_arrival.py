"""A task routed to a busy worker has its model loaded while the task ahead of it runs,
as the planner (and the simulator) assume: the worker does not wait for the task's own
start, or for the next task to start, to begin the load."""

from __future__ import annotations

import time

import pytest

from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live, wait_started
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
# "big" (3,000 MB) is not resident and loads in 1,000 ms at 3,000 MB/s; "small" is.
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "small",
       "--compass-load-mb-per-s", "3000"]


def test_a_model_is_loaded_while_the_task_ahead_runs(compass_redis_url, compass_workers):
    w = compass_workers("tests.support.jobapp", "pf1@prefetch", *GPU,
                        env={"COMPASS_BROKER_URL": compass_redis_url})
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    wait_live(app, 1, [w])

    slow = app.tasks["j.wait"].delay(1, 2.0)  # 2 s on the resident "small"
    wait_started(app, slow)  # a load from here overlaps it
    heavy = app.tasks["j.heavy"].delay("x")  # 300 ms on "big", which must load (1,000 ms)
    slow.get(timeout=20)
    done_slow = time.monotonic()
    assert heavy.get(timeout=20) == "x"
    after = (time.monotonic() - done_slow) * 1000
    # the same task again, "big" now resident: its run plus a round trip, on this machine
    # as loaded as it is now (a baseline, not a guess at a hop's length)
    t0 = time.monotonic()
    assert app.tasks["j.heavy"].delay("y").get(timeout=20) == "y"
    resident = (time.monotonic() - t0) * 1000
    # loaded during the slow task: no more than a resident run after the slow one;
    # loaded only once it started: 1,000 ms of load on top of one
    assert after - resident < 500, (after, resident, worker_logs([w]))
