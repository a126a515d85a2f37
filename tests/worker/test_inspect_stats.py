"""``celery inspect stats`` (what Flower's worker page shows) carries compass's state."""

from __future__ import annotations

import pytest

from compass_celery.local import wait_until
from tests.support.cluster import start

pytestmark = pytest.mark.redis


def test_inspect_stats_shows_models_memory_and_backlog(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["i0@stats"], timeout_s=3.0)
    replies = wait_until(lambda: app.control.inspect(destination=["i0@stats"],
                                                     timeout=2.0).stats(), 30, "a stats reply")
    assert replies["i0@stats"]["prefetch_count"] == 1  # solo pool: one task held at a time
    stats = replies["i0@stats"]  # named fields, each a row of Flower's worker page
    assert "compass" not in stats  # not one raw dict
    assert stats["compass_queue"] == app.compass.queue_for("i0@stats")
    assert stats["compass_resident_models"] == "big, small"  # preloaded
    assert stats["compass_gpu_total_mb"] == 4000.0
    assert stats["compass_gpu_free_mb"] == pytest.approx(4000.0 - 3000.0 - 50.0)
    assert stats["compass_backlog_ms"] == 0.0 and stats["compass_running"] == 0
    assert stats["compass_cache_loads"] == 2 and stats["compass_device"] == "emulated"
