"""The producers benchmark runs end to end against a real Redis (a short run)."""

from __future__ import annotations

import pytest

from compass_celery.bench import producers

pytestmark = pytest.mark.redis


def test_producers_bench_routes_reads_and_reports_egress() -> None:
    r = producers.run(records=16, producers=2, seconds=0.6, changing=0.25, warmup_s=0.3,
                      ahead=0.0, drift=0.0)
    assert r["workers_seen"] == 16  # every published record is live to every producer
    assert r["decisions_per_s"] > 0 and r["fresh_reads_per_s"] > 0
    assert r["waited_decisions_per_s"] > 0  # no read-ahead: decisions wait for their reads
    assert r["fresh_decision_ms"]["p50"] >= r["fresh_read_ms"]["p50"] * 0.5
    assert r["producer_egress_bytes_per_decision"] >= 0 and r["drift"] == 0.0
    assert "decisions/s" in producers.report(r)
