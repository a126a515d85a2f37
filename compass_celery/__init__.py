"""compass-celery: Compass-style DAG- and GPU-cache-aware scheduling for Celery.

``Compass(app)`` installs everything on a Celery app; tasks declare the model
they need with ``@app.task(compass_model="name", compass_exec_ms=120)``.
Names load lazily so that ``compass_celery.planner`` (pure) never pulls in Celery.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {"Compass": "app", "Dag": "jobs", "JobHandle": "jobs", "get_model": "cache",
            "model": "cache",
            "Decision": "placement", "CompassInputError": "errors",
            "DagValidationError": "jobs", "PlacementError": "placement",
            "JobError": "errors", "JobFailed": "errors", "JobTimeout": "errors",
            "RetriesExhausted": "errors", "SendFailed": "errors", "Rejected": "errors",
            "DeadlineMissed": "errors"}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'compass_celery' has no attribute {name!r}")
