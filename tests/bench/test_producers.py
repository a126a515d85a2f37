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
    # each fresh read fetched the records that changed and never more than the whole table;
    # the egress a read is not bounded by the table: the charges' replies share it, and
    # they grow with the decisions a read serves (thousands on a fast machine)
    assert 0 < r["records_per_fresh_read"] <= r["records"] / 2, r  # changes, not the table
    assert r["charge_flushes_per_s"] > 0
    assert r["producer_egress_bytes_per_fresh_read"] > 0
    assert r["producer_egress_bytes_per_decision"] > 0 and r["drift"] == 0.0
    assert "decisions/s" in producers.report(r)


def test_a_paced_producer_kept_fresh_never_waits_and_plans_on_fresh_state() -> None:
    kept = producers.run(records=16, producers=1, seconds=1.2, warmup_s=0.3, interval_s=0.2,
                         keep_fresh=1.0)
    assert kept["decisions_per_s"] > 0
    assert kept["waited_decisions_per_s"] == 0  # the reads ran between its decisions
    assert kept["fresh_reads_per_s"] >= 10  # one about every 75 ms (TTL + half read-ahead)
    assert kept["state_age_ms"]["p50"] <= 100.0  # TTL + read-ahead, the bound without it
    idle = producers.run(records=16, producers=1, seconds=1.2, warmup_s=0.3, interval_s=0.2,
                         keep_fresh=0.0)
    assert idle["waited_decisions_per_s"] == idle["decisions_per_s"]  # each read first
    assert idle["fresh_reads_per_s"] <= idle["decisions_per_s"] + 1
