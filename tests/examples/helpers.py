"""Shared helpers for the example-project tests: paths, worker env, liveness."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from compass_celery import Compass
from compass_celery.jobs import JobHandle
from compass_celery.local import WorkerProcess, wait_until
from compass_celery.testing import worker_logs

ROOT = Path(__file__).resolve().parents[2]
DJANGO_DIR = ROOT / "examples" / "django_project"
FLASK_DIR = ROOT / "examples" / "flask_app"
MODELS = {"detector": 1200, "captioner": 950, "translator": 300}
# no port listens here: an eager test that opened Redis would fail loudly
DEAD_REDIS = "redis://127.0.0.1:1/0"
NODES = {"detect", "caption", "translate"}
# the examples' tasks are deterministic: these are their results for these inputs
CAT = "https://example.com/cat.jpg"
CAT_FR = "un photo de un vélo et un personne"
DOG = "https://example.com/dog.png"
DOG_DE = "ein Foto von ein Auto und ein Hund"


def pythonpath(*dirs: Path) -> str:
    """PYTHONPATH for a worker process: ``dirs`` first, then the repo and what was set."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*map(str, dirs), str(ROOT), *rest])


def probe(url: str) -> Celery:
    """A bare Compass app on ``url``: reads worker records and job records."""
    app = Celery("examples-probe", broker=url, backend=url)
    app.conf.update(compass_models=MODELS, compass_snapshot_ttl_s=0.0)
    Compass(app)
    return app


def wait_live(app: Celery, names: set[str], workers: list[WorkerProcess],
              timeout: float = 60) -> None:
    """Wait until every named worker has published a live record."""
    def live() -> bool:
        snap = app.compass.reader.store.snapshot(
            time.time(), app.compass.settings["heartbeat_timeout_s"])
        return names <= {w.name for w in snap.workers}

    try:
        wait_until(live, timeout, f"live workers {sorted(names)}")
    except TimeoutError:
        raise AssertionError(worker_logs(workers)) from None


def job_record(app: Celery, job_id: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Status, results and placement of a job as Redis holds them (not via the app)."""
    job = JobHandle(app.compass, job_id)
    return job.status, job.get(timeout=10), job.placement()
