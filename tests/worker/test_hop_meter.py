"""The dispatch hop a worker learns: only gaps between back-to-back tasks count."""

from __future__ import annotations

import pytest

from compass_celery.worker.hop import DispatchHop


def test_a_gap_counts_only_when_the_next_task_was_already_waiting_alone() -> None:
    hop = DispatchHop(alpha=0.5)
    hop.started(10.000, queued_at=9.0, alone=True)  # first task: no gap to time
    assert hop.ms() == 0.0
    hop.ended(10.100)
    hop.started(10.104, queued_at=10.050, alone=True)  # waited: a 4 ms gap
    assert hop.ms() == pytest.approx(4.0)
    hop.ended(10.200)
    hop.started(10.700, queued_at=10.650, alone=True)  # sent after the end: idle time
    hop.ended(10.800)
    hop.started(10.806, queued_at=10.700, alone=False)  # another task ran between
    hop.ended(10.900)
    hop.started(10.910, queued_at=0.0, alone=True)  # sent by no compass router
    assert hop.ms() == pytest.approx(4.0) and hop.samples == 1
    hop.ended(11.000)
    hop.started(11.008, queued_at=10.990, alone=True)
    assert hop.ms() == pytest.approx(6.0)  # 4 + 0.5 x (8 - 4)


def test_the_published_hop_moves_only_in_steps() -> None:
    """The record carries the hop: one that followed every gap would be rewritten, and
    decoded by every producer, after every task."""
    hop = DispatchHop(alpha=0.5)
    hop.ended(1.0)
    hop.started(1.010, queued_at=0.5, alone=True)
    assert hop.ms() == pytest.approx(10.0)
    hop.ended(2.0)
    hop.started(2.0108, queued_at=1.5, alone=True)  # mean 10.4: under a 1 ms step
    assert hop.ms() == pytest.approx(10.0)
    hop.ended(3.0)
    hop.started(3.0128, queued_at=2.5, alone=True)  # mean 11.6: a step away
    assert hop.ms() == pytest.approx(11.6)


def test_the_hop_is_learned_in_workload_ms() -> None:
    hop = DispatchHop(alpha=1.0, time_scale=0.5)  # half-speed time: each real ms is two
    hop.ended(1.0)
    hop.started(1.003, queued_at=0.5, alone=True)
    assert hop.ms() == pytest.approx(6.0)
