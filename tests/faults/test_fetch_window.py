"""The fetch window, hunted: workers SIGKILLed and restarted under their own names at random
moments (in start-up and take-back too) while plain tasks arrive; nothing may be lost."""

from __future__ import annotations

import os

import pytest

from compass_celery.testing import worker_logs
from tests.support.cluster import start
from tests.support.hunt import run_hunt

pytestmark = pytest.mark.redis

#: Sized for a 2-core CI machine; the benchmark's repeated-kill row runs 50 and more.
KILLS = int(os.environ.get("COMPASS_HUNT_KILLS", "25"))


def test_no_message_is_lost_when_workers_are_killed_again_and_again(
        compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["h0@hunt", "h1@hunt"])
    hunt = run_hunt(app, ws, kills=KILLS, every_s=1.5, rate=40.0, wait_s=60.0)
    print(hunt.summary())
    assert len(hunt.kills) == KILLS
    assert not hunt.missing, hunt.summary() + worker_logs(ws)[-3000:]
    assert not hunt.failed and not hunt.dead_lettered, hunt.summary()
    assert hunt.completed == len(hunt.sent)
    # at-least-once: only a task cut by a kill runs again, one per kill at most
    assert hunt.duplicates <= KILLS, hunt.summary()
    assert not hunt.stranded, hunt.summary()
    # the workers fetched atomically (fetch.lua, BLMOVE), never with kombu's BRPOP
    stats = app.log.info("commandstats")
    assert stats.get("cmdstat_blmove", {}).get("calls") and "cmdstat_brpop" not in stats
