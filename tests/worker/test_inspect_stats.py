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
    stats = replies["i0@stats"]["compass"]
    assert stats["queue"] == app.compass.queue_for("i0@stats")
    assert stats["resident_models"] == ["big", "small"]  # preloaded
    assert stats["gpu_total_mb"] == 4000.0
    assert stats["gpu_free_mb"] == pytest.approx(4000.0 - 3000.0 - 50.0)
    assert stats["backlog_ms"] == 0.0 and stats["running"] == 0
