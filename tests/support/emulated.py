"""One real emulated-GPU worker and a producer app on it: the start of many tests."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from compass_celery.emulated import make_app
from compass_celery.local import WorkerProcess, wait_until
from compass_celery.testing import worker_logs


def one_emulated(url: str, compass_workers: Any, name: str, models: Mapping[str, float],
                 *args: str) -> tuple[Any, WorkerProcess]:
    """Start emulated worker ``name`` (``args``: its ``--compass-*`` options) knowing
    ``models``, and a producer app that reads fresh state; wait for the worker's record
    (its log in the failure when it never comes)."""
    env = {"COMPASS_BROKER_URL": url, "COMPASS_MODELS": json.dumps(dict(models))}
    w = compass_workers("compass_celery.emulated_app", name, *args, env=env)
    app = make_app(url, compass_models=dict(models), compass_snapshot_ttl_s=0)
    try:
        wait_until(lambda: app.compass.store.snapshot(time.time(), 5.0).workers or None, 30,
                   "the worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    return app, w
