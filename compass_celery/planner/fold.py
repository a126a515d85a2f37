"""A producer's own decisions, folded into the snapshot it plans on.

Between two reads of the workers' records a producer plans on the last one it read. Its
own decisions since are not in those records yet, so it folds them in as it makes them,
until a fresher record of the worker replaces the row: the router into its reader's
snapshot (``state.reader``), the simulator into its stale snapshot (``--refresh-ms``),
both with these rules. :func:`charged` is a backlog charge: without it, every task of a
burst would see the same backlog and pile onto the worker that looked idle.
"""

from __future__ import annotations

from typing import Any

from .cost import evolve
from .types import WorkerView


def charged(w: WorkerView, ms: float, pending: bool = False,
            level: int | None = None, total: bool = True) -> WorkerView:
    """``w`` with ``ms`` added to its backlog (``pending``: its planned-but-unsent work;
    ``level``: its queued (or planned) work of that priority, and the total unless
    ``total`` is off), never below zero, as reads of the store's counters clamp them:
    a producer's own charge, folded into its snapshot until a fresher record has it."""
    total_field, by_level = ("pending_ms", "pending_queued_ms") if pending \
        else ("backlog_ms", "queued_ms")
    changes: dict[str, Any] = \
        {total_field: max(0.0, getattr(w, total_field) + ms)} if total else {}
    if level is not None:
        queued = dict(getattr(w, by_level))
        queued[level] = max(0.0, queued.get(level, 0.0) + ms)
        changes[by_level] = queued
    return evolve(w, **changes)
