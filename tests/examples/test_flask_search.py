"""The Flask example with the real models (``COMPASS_EXAMPLE_MODELS = "real"``), eager:
Flask's test client POSTs a voice search and reads it back through the status view, with
all-MiniLM-L6-v2 and Silero VAD run in process and no Redis. The models load once for the
module (the first search); the refusals need no model."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from compass_celery.testing import add_worker

from .helpers import (
    BAD_SEARCHES,
    DEAD_REDIS,
    FLASK_DIR,
    NOT_SPOKEN,
    SEARCH_NODES,
    SEARCH_QUERY,
    TOP_HIT,
    needs_real_models,
)

pytest.importorskip("flask")
if str(FLASK_DIR) not in sys.path:
    sys.path.insert(0, str(FLASK_DIR))


def make(**config: Any) -> Any:
    """An eager app on a broker URL where nothing listens."""
    from vision_api import create_app

    return create_app({"TESTING": True, **config, "CELERY": {
        "task_always_eager": True, "broker_url": DEAD_REDIS, "result_backend": DEAD_REDIS}})


@pytest.fixture(scope="module")
def real_app() -> Any:
    """The app on the real models, with one in-process CPU worker of 200 MB."""
    app = make(COMPASS_EXAMPLE_MODELS="real")
    add_worker(app.extensions["celery"], "cpu0", gpu_mb=200)
    return app


@pytest.fixture(scope="module")
def searched(real_app: Any) -> dict[str, Any]:
    """One search for the example query, and its status once done (the models load here)."""
    needs_real_models()
    client = real_app.test_client()
    posted = client.post("/search/", json={"query": SEARCH_QUERY})
    assert posted.status_code == 202, posted.json
    status = client.get(posted.json["status_url"])
    assert status.status_code == 200
    return {"post": posted.json, "status": status.json}


def test_search_ranks_the_spoken_lines(searched: dict[str, Any]) -> None:
    post, body = searched["post"], searched["status"]
    assert post["status_url"] == f"/jobs/{post['job_id']}/"
    assert body["status"] == "SUCCESS", body
    rank = body["results"]["rank"]
    assert rank["hits"][0]["text"].startswith(TOP_HIT), rank
    assert rank["hits"][0]["score"] > rank["hits"][1]["score"] + 0.2, rank
    assert [x["text"] for x in rank["not_spoken"]] == [NOT_SPOKEN]
    assert len(rank["speech"]) == 2  # the clip's two spoken parts
    assert set(body["placement"]) == SEARCH_NODES
    assert {p["worker"] for p in body["placement"].values()} == {"cpu0"}


def test_search_ranks_the_lines_it_is_given(real_app: Any, searched: Any) -> None:
    """Lines in the request replace the clip's transcript; speech still decides which
    count: the one said over the hiss (4.6-5.8 s) is set aside, however well it matches."""
    lines = [{"start": 1.6, "end": 3.9, "text": "my cat sleeps on the sofa all day"},
             {"start": 4.6, "end": 5.8, "text": "the budget meeting is on monday"},
             {"start": 6.1, "end": 8.4, "text": "finance moved the budget meeting to friday"}]
    client = real_app.test_client()
    posted = client.post("/search/", json={"query": SEARCH_QUERY, "lines": lines})
    assert posted.status_code == 202, posted.json
    rank = client.get(posted.json["status_url"]).json["results"]["rank"]
    assert [h["text"] for h in rank["hits"]] == [lines[2]["text"], lines[0]["text"]]
    assert [x["text"] for x in rank["not_spoken"]] == [lines[1]["text"]]


@pytest.mark.parametrize("body, message", BAD_SEARCHES,
                         ids=[message for _, message in BAD_SEARCHES])
def test_bad_searches_are_refused(real_app: Any, body: Any, message: str) -> None:
    res = real_app.test_client().post("/search/", json=body)
    assert res.status_code == 400
    assert message in res.json["error"]


def test_search_takes_json_posts_only(real_app: Any) -> None:
    client = real_app.test_client()
    res = client.post("/search/", data="{not json", content_type="application/json")
    assert res.status_code == 400
    assert "JSON object" in res.json["error"]
    assert client.get("/search/").status_code == 405


def test_one_environment_variable_switches_to_the_real_models(monkeypatch: Any) -> None:
    monkeypatch.setenv("FLASK_COMPASS_EXAMPLE_MODELS", "real")
    app = make()
    assert app.config["COMPASS_EXAMPLE_MODELS"] == "real"
    celery_app = app.extensions["celery"]
    assert {"pretrained.speech", "pretrained.embed", "pretrained.rank"} <= set(celery_app.tasks)
    assert {"minilm", "silero-vad", "detector"} <= set(celery_app.conf.compass_models)
    monkeypatch.setenv("FLASK_COMPASS_EXAMPLE_MODELS", "fake")
    with pytest.raises(ValueError, match="COMPASS_EXAMPLE_MODELS is 'fake'"):
        make()
