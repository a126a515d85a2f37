"""Pending work: what a plan charges to workers before their tasks are sent.

A job is planned whole at submission, but only its sources are sent then; every other
task waits for its inputs. Its planned run time counts on its planned worker meanwhile
(``WorkerView.pending_ms``), so jobs planned one after another do not all pick the same
worker, and is released when the task is sent. The real runtime and the simulator both
decide what to charge here, and release the same amounts when they send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .types import SHARED, Placement


def send_charge_ms(run_ms: float, hop_ms: float) -> float:
    """What sending a task charges its worker's backlog: its run and that worker's
    per-task dispatch (``WorkerView.hop_ms``), which occupies the worker before every
    start. One rule for the plan's pending work, the producers' charges and the
    simulator's, so what a send charges is what is released when the task ends."""
    return run_ms + hop_ms


def pending_work(
    placements: Mapping[str, Placement], preds: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, float]]:
    """Node -> (planned worker, ms) for each task a new plan leaves waiting: its run
    and its worker's per-task dispatch (``Placement.hop_ms``), what sending it charges.

    Sources are sent at once and shared-queue tasks have no worker to charge, so
    neither is pending. Entries keep the plan's order, so callers charge (and a
    simulator sums) in the same order every run.
    """
    return {node: (p.worker, send_charge_ms(p.run_ms, p.hop_ms)) for node, p in placements.items()
            if preds.get(node) and p.worker != SHARED}
