"""Shared helpers for the example-project tests: paths, worker env, liveness."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
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
# the voice search (real models) on the built-in clip: the answer known for this query
SEARCH_QUERY = "when is the budget meeting"
TOP_HIT = "the quarterly budget review"
NOT_SPOKEN = "thanks for watching, please subscribe"
SEARCH_NODES = {"speech", "query", "lines", "rank"}
#: Bodies that ``POST /search/`` refuses with 400, and a part of each error message.
BAD_SEARCHES: list[tuple[Any, str]] = [
    ({}, "query (a non-empty string) is required"),
    ({"query": ""}, "query (a non-empty string) is required"),
    ({"query": "   "}, "query (a non-empty string) is required"),
    ({"query": 7}, "query (a non-empty string) is required"),
    ({"query": "x" * 501}, "query is 501 characters: at most 500"),
    (["budget"], "the body must be a JSON object"),
    ({"query": "budget", "audio": "AAAA"}, "audio is not taken here"),
    ({"query": "budget", "lines": []}, "lines must be a list of 1 to 100"),
    ({"query": "budget", "lines": "the budget"}, "lines must be a list"),
    ({"query": "budget", "lines": ["the budget"]}, "lines[0] must be an object"),
    ({"query": "budget", "lines": [{"start": 0, "end": 1, "text": "a"},
                                   {"end": 1, "text": "b"}]}, "lines[1].start must be a number"),
    ({"query": "budget", "lines": [{"start": 0, "end": "1", "text": "a"}]},
     "lines[0].end must be a number"),
    ({"query": "budget", "lines": [{"start": -1, "end": 1, "text": "a"}]},
     "lines[0].start must be a number of seconds, 0 or more"),
    ({"query": "budget", "lines": [{"start": 2, "end": 1, "text": "a"}]},
     "lines[0].end must be after its start"),
    ({"query": "budget", "lines": [{"start": 0, "end": 1, "text": ""}]},
     "lines[0].text must be a non-empty string"),
    ({"query": "budget", "lines": [{"start": 0, "end": 1, "text": "a" * 501}]},
     "lines[0].text is 501 characters"),
]


def needs_real_models() -> None:
    """Skip the calling test unless the real models' packages are installed."""
    for module in ("sentence_transformers", "silero_vad"):
        pytest.importorskip(module, reason=f"needs {module}: pip install -e '.[examples,real]'")


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
