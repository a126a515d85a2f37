"""The Django example's deadline answers, as its "web" process sees them: against the
Redis in ``CELERY_BROKER_URL`` and one worker that imports ``tests.examples.busy``.

Keeps the worker busy with 2 s of work declared as 1 ms, POSTs a job with 1 s to go (the
plan takes it), queues 3 s of work declared as such, POSTs a job with 500 ms to go (the
plan refuses it), then polls the first job's status until it ends. Prints every answer
as one JSON object.

    python -m tests.examples.django_deadline_driver IMAGE_URL
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def answer(res: Any) -> dict[str, Any]:
    """A response's status code, Retry-After header and JSON body."""
    return {"code": res.status_code, "retry_after": res.headers.get("Retry-After"),
            "body": res.json()}


def main(image_url: str, timeout: float = 30.0) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    import django

    django.setup()
    from django.test import Client
    from proj.celery import app

    from tests.examples.busy import HOLD

    client, hold = Client(), app.tasks[HOLD]

    def post(body: dict[str, Any]) -> dict[str, Any]:
        return answer(client.post("/jobs/", {"image_url": image_url, **body},
                                  content_type="application/json"))

    hold.apply_async((2.0,), compass={"exec_ms": 1})
    out: dict[str, Any] = {"taken": post({"deadline_ms": 1000})}
    hold.apply_async((0.1,), compass={"exec_ms": 3000})
    out["refused"] = post({"deadline_ms": 500})
    out["bad"] = post({"slo": "platinum"})
    url = out["taken"]["body"].get("status_url")
    deadline = time.monotonic() + timeout
    while url and time.monotonic() < deadline:
        out["final"] = answer(client.get(url))
        if out["final"]["body"].get("status") in ("SUCCESS", "FAILURE"):
            break
        time.sleep(0.05)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
