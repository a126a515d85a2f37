"""Eager mode's placement: with ``task_always_eager`` Celery never calls routers, so the
task class (:mod:`compass_celery.task_class`) asks :func:`place_eagerly` where the task
goes before running it inline, against in-process state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import ledger
from .needs import resolve_needs
from .placement import Decision, decide
from .router import announce

if TYPE_CHECKING:
    from .context import CompassContext


def place_eagerly(c: CompassContext, task: Any, options: dict[str, Any]) -> Decision | None:
    """Eager mode's placement (routers are not called there), charged like the router's.

    None for a task without compass options; raises PlacementError on bad input."""
    snapshot = c.reader.get()
    needs = resolve_needs(task.name, task, options, snapshot.profiles,
                            c.settings.default_exec_ms)
    if needs is None:
        return None
    decision = decide(needs, snapshot, c.policy, c.model_sizes(), c.shared_queue,
                      c.settings.validate, batch_aware=c.settings.batch_aware)
    ledger.charge(c, decision)
    announce(c, decision)
    return decision
