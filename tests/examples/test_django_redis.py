"""The Django example against a real Redis and real workers.

Two ``celery -A proj worker`` processes with emulated GPUs: dj0 holds every model,
dj1 none. The "web" process (Django's test client, in a child process so it gets its
own Django settings) POSTs a job and polls its status view until it ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest

from compass_celery.testing import worker_logs

from .helpers import CAT, CAT_FR, DJANGO_DIR, NODES, ROOT, job_record, probe, pythonpath, wait_live

pytest.importorskip("django")
pytestmark = pytest.mark.redis

EMULATED = ["--compass-emulate-gpu-mb", "4000"]


def django_env(url: str) -> dict[str, str]:
    return {"PYTHONPATH": pythonpath(DJANGO_DIR), "DJANGO_SETTINGS_MODULE": "proj.settings",
            "CELERY_BROKER_URL": url, "CELERY_RESULT_BACKEND": url,
            "CELERY_TASK_ALWAYS_EAGER": "0"}


def test_job_from_a_django_view_runs_on_the_worker_holding_its_models(
        compass_redis_url: str, compass_workers: Any) -> None:
    url = compass_redis_url
    env = django_env(url)
    workers = [
        compass_workers("proj", "dj0@example", *EMULATED, "--compass-preload",
                        "detector,captioner,translator", env=env),
        compass_workers("proj", "dj1@example", *EMULATED, env=env),
    ]
    app = probe(url)
    wait_live(app, {"dj0@example", "dj1@example"}, workers)

    run = subprocess.run([sys.executable, "-m", "tests.examples.django_driver", CAT, "fr"],
                         env={**os.environ, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + worker_logs(workers)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["post_code"] == 202
    final = out["final"]
    assert out["status_code"] == 200
    assert final["status"] == "SUCCESS", (final, worker_logs(workers))
    assert final["results"] == {"translate": CAT_FR}
    assert set(final["placement"]) == NODES
    for node, where in final["placement"].items():
        assert where["planned"] == "dj0@example", node
        assert where["worker"] == "dj0@example", node  # where it really ran
        assert where["moved"] is False
        assert datetime.fromisoformat(where["started"]).tzinfo is not None
        assert all(isinstance(where[k], int) for k in ("queued_ms", "load_ms", "run_ms"))

    # the view read what the workers wrote to Redis: the same record, read directly
    status, results, placement = job_record(app, out["post"]["job_id"])
    assert (status, results) == ("SUCCESS", {"translate": CAT_FR})
    assert {n: p["worker"] for n, p in placement.items()} == dict.fromkeys(NODES,
                                                                          "dj0@example")


def test_a_busy_worker_answers_429_with_retry_after_and_a_late_job_504(
        compass_redis_url: str, compass_workers: Any) -> None:
    """One worker kept busy by a long task (tests.examples.busy): the view refuses at once
    a job whose deadline the plan says cannot be met (429, Retry-After), and answers 504
    for one that was taken and then dropped because it fell behind."""
    url = compass_redis_url
    env = django_env(url)
    workers = [compass_workers("proj", "dj0@example", *EMULATED, "--compass-preload",
                               "detector,captioner,translator", "--include",
                               "tests.examples.busy", env=env)]
    wait_live(probe(url), {"dj0@example"}, workers)

    run = subprocess.run([sys.executable, "-m", "tests.examples.django_deadline_driver", CAT],
                         env={**os.environ, **env}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + worker_logs(workers)
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["taken"]["code"] == 202, out
    refused = out["refused"]
    assert refused["code"] == 429, out
    assert int(refused["retry_after"]) >= 2  # about 3 s of work ahead of it
    assert refused["body"]["error"] == "rejected" and "deadline" in refused["body"]["reason"]
    assert refused["body"]["predicted_ms"] > 3000 and refused["body"]["deadline_ms"] == 500
    assert out["bad"]["code"] == 400 and "platinum" in out["bad"]["body"]["error"]
    final = out["final"]
    assert final["code"] == 504, (out, worker_logs(workers))
    assert final["body"]["error"]["exc_type"] == "DeadlineMissed"
    assert "deadline" in final["body"]["message"]
