"""Eager mode: with ``task_always_eager`` Celery never calls routers, so the task
class places the task itself before running it inline, against in-process state.
"""

from __future__ import annotations

from typing import Any

from celery import Celery


class CompassTaskMixin:
    """Mixed into ``app.Task`` by ``Compass(app)``; only acts in eager mode."""

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        compass = getattr(self.app, "compass", None)  # type: ignore[attr-defined]
        if compass is None or not compass.eager:
            return super().apply(args, kwargs, **options)  # type: ignore[misc]
        decision = compass.place_eagerly(self, options)  # raises PlacementError on bad input
        if decision is None:
            return super().apply(args, kwargs, **options)  # type: ignore[misc]
        headers = dict(options.pop("headers", None) or {})
        headers["compass"] = decision.as_header()
        try:
            result = super().apply(args, kwargs, headers=headers, **options)  # type: ignore[misc]
        finally:
            compass._charge_local(decision, -1)
        compass.remember(result.id, decision)
        return result


def install_task_class(app: Celery) -> None:
    """Make ``app.Task`` place eagerly; call ``Compass(app)`` before defining tasks."""
    base = app.Task
    if issubclass(base, CompassTaskMixin):
        return
    app.Task = type(base.__name__, (CompassTaskMixin, base), {"__module__": base.__module__})
