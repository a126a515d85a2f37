"""The Django example with the real models (``COMPASS_EXAMPLE_MODELS=real``), eager: Django's
test client POSTs a voice search and reads it back through the status view, with
all-MiniLM-L6-v2 and Silero VAD run in process and no Redis.

Django's settings are process-global and the other Django tests set up the emulated
project in this process, so this runs the project in a child process
(``tests/examples/django_search_driver.py``), once for the whole module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from .helpers import (
    BAD_SEARCHES,
    DJANGO_DIR,
    NOT_SPOKEN,
    ROOT,
    SEARCH_NODES,
    TOP_HIT,
    needs_real_models,
    pythonpath,
)

pytest.importorskip("django")


def _have_real_models() -> bool:
    return all(importlib.util.find_spec(m) for m in ("sentence_transformers", "silero_vad"))


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    """What the driver saw: the refusals and, with the real extra installed, one search."""
    env = {**os.environ, "PYTHONPATH": pythonpath(DJANGO_DIR)}
    args = ["--search"] if _have_real_models() else []
    run = subprocess.run([sys.executable, "-m", "tests.examples.django_search_driver", *args],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_search_ranks_the_spoken_lines(seen: dict[str, Any]) -> None:
    needs_real_models()
    assert seen["post_code"] == 202, seen["post"]
    assert seen["post"]["status_url"] == f"/jobs/{seen['post']['job_id']}/"
    assert seen["status_code"] == 200
    body = seen["final"]
    assert body["status"] == "SUCCESS", body
    rank = body["results"]["rank"]
    assert rank["hits"][0]["text"].startswith(TOP_HIT), rank
    assert rank["hits"][0]["score"] > rank["hits"][1]["score"] + 0.2, rank
    assert [x["text"] for x in rank["not_spoken"]] == [NOT_SPOKEN]
    assert len(rank["speech"]) == 2  # the clip's two spoken parts
    assert set(body["placement"]) == SEARCH_NODES
    assert {p["worker"] for p in body["placement"].values()} == {"cpu0"}


@pytest.mark.parametrize("case", range(len(BAD_SEARCHES)),
                         ids=[message for _, message in BAD_SEARCHES])
def test_bad_searches_are_refused(seen: dict[str, Any], case: int) -> None:
    code, error = seen["bad"][case]
    assert code == 400
    assert BAD_SEARCHES[case][1] in error


def test_search_takes_json_posts_only(seen: dict[str, Any]) -> None:
    assert seen["not_json"] == [400, "the body must be JSON"]
    assert seen["get_search"] == 405
