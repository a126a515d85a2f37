"""The local provider with real worker processes: a scale-out whose new worker has its
hinted model resident before its first task, and a scale-in under load that drains the
worker the rule chose (SIGTERM hand-back) with every job completing exactly once."""

from __future__ import annotations

import time

import pytest
import redis

from compass_celery.local import wait_until
from compass_celery.planner.scaling import Need, choose_removals, members_from
from compass_celery.providers import LocalProvider
from compass_celery.testing import worker_logs
from tests.support.cluster import compass_keys_left, executions, wait_live
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis


def _live(app):
    return {w.name: w for w in app.compass.reader.store.snapshot(
        time.time(), app.compass.settings["heartbeat_timeout_s"]).workers}


def test_scale_out_preloads_and_scale_in_drains_the_chosen_worker(compass_redis_url):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}
    with LocalProvider("tests.support.jobapp", args=["--compass-emulate-gpu-mb", "4000"],
                       env=env, prefix="as", host="scale") as provider:
        procs = lambda: [provider.process(n) for n in provider.names()]  # noqa: E731
        first = provider.add(("big", "small"))
        app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0,
                       compass_heartbeat_timeout_s=1.0)
        app.log = redis.Redis.from_url(compass_redis_url)  # the run log (executions)
        wait_live(app, 1, procs())
        second = provider.add(("big",))
        # its first record already holds the hint: loaded before it took any task
        seen = wait_until(lambda: _live(app).get(second), 60, f"{second} to publish")
        assert "big" in seen.resident, worker_logs(procs())
        assert provider.names() == [first, second]

        results = [app.tasks["j.seen"].apply_async((i, 400)) for i in range(10)]
        placed = {app.compass.placement(r.id).worker for r in results}
        assert placed == {first, second}  # both hold big: the load is spread
        wait_until(lambda: executions(app), 20, "the first task to start")
        live = _live(app)
        # the rule's choice: the worker whose queued work and models are least needed
        chosen = choose_removals(1, members_from(live.values()),
                                 Need(1, 1, targets={"big": 1}))[0]
        queue = live[chosen].queue
        gone = provider.process(chosen)
        provider.remove(chosen)
        assert not gone.alive()
        assert "handed back" in gone.log(), gone.log()  # it left tasks waiting: re-placed
        assert chosen not in provider.names()
        kept = provider.names()[0]
        assert provider.process(kept).alive()

        assert sorted(r.get(timeout=90) for r in results) == list(range(10)), \
            worker_logs(procs())
        runs = executions(app)
        assert all(runs[r.id] == 1 for r in results), runs  # nothing ran twice
        assert compass_keys_left(app, [queue]) == {}  # nothing left behind
        wait_live(app, 1, procs())
        assert set(_live(app)) == {kept}


def test_a_worker_started_with_the_hint_flag_preloads_the_published_hint(compass_redis_url):
    """The Kubernetes path's preload: the controller publishes a hint in Redis, a worker
    run with ``--compass-preload @hint`` pops it and holds those models in its first
    record; the next worker finds none left and starts with nothing loaded."""
    from compass_celery.providers import HINT, publish_hints

    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0,
                   compass_heartbeat_timeout_s=1.0)
    client = redis.Redis.from_url(compass_redis_url)
    publish_hints(client, app.compass.settings["key_prefix"], [("big",)])
    with LocalProvider("tests.support.jobapp", env=env, prefix="hint", host="k8s",
                       args=["--compass-emulate-gpu-mb", "4000", "--compass-preload", HINT]
                       ) as provider:
        first = provider.add()
        seen = wait_until(lambda: _live(app).get(first), 60, f"{first} to publish")
        assert set(seen.resident) == {"big"}, provider.process(first).log()
        second = provider.add()
        seen = wait_until(lambda: _live(app).get(second), 60, f"{second} to publish")
        assert set(seen.resident) == set(), provider.process(second).log()
