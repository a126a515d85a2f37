"""Worker app for the batch-hold tests: the job-runtime app plus a batched task that may
hold a forming batch open for seconds, and a busy task that logs when it ends, so a test
can read when a batch started against when the worker was free to start it."""

from __future__ import annotations

import json
import time
from typing import Any

from celery import Celery

from tests.support.jobapp import BROKER
from tests.support.jobapp import make_app as make_job_app

#: How long (workload ms; the worker's time scale is 1) ``h.embed`` may hold a batch open.
HOLD_MS = 3000
#: The same for ``h.embed_short``: short enough for a busy task to outlast it.
SHORT_HOLD_MS = 1000


def make_app(broker: str = BROKER, **conf: Any) -> Celery:
    """The job-runtime app with the hold tests' tasks."""
    app = make_job_app(broker, **conf)

    def log(key: str, value: Any) -> None:
        app.compass.store.client.rpush(key, json.dumps(value))

    @app.task(name="h.busy", bind=True, shared=False, compass_model="small",
              compass_exec_ms=5)
    def busy(self: Any, seconds: float) -> float:
        """Keeps the worker busy, so what is sent meanwhile queues up; logs its end."""
        time.sleep(seconds)
        end = time.time()
        log("busy_end", end)
        return end

    def batched(name: str, hold_ms: int) -> None:
        @app.task(name=name, bind=True, shared=False, compass_model="small",
                  compass_exec_ms=5,
                  compass_batch={"max_size": 8, "max_wait_ms": hold_ms, "per_item_ms": 1})
        def embed(self: Any, xs: list[Any]) -> list[Any]:
            """Batched; logs when each pass started and its inputs."""
            log("held", {"t": time.time(), "xs": xs})
            return [f"e({x})" for x in xs]

    batched("h.embed", HOLD_MS)
    batched("h.embed_short", SHORT_HOLD_MS)
    return app


app = make_app()
