"""The Flask example: eager mode with Flask's test client and no Redis at all, and
against a real Redis with two real workers (``celery -A make_celery worker``)."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

import pytest

from compass_celery.testing import add_worker, worker_logs

from .helpers import (
    CAT,
    CAT_FR,
    DEAD_REDIS,
    DOG,
    DOG_DE,
    FLASK_DIR,
    NODES,
    job_record,
    probe,
    pythonpath,
    wait_live,
)

pytest.importorskip("flask")
if str(FLASK_DIR) not in sys.path:
    sys.path.insert(0, str(FLASK_DIR))

EMULATED = ["--compass-emulate-gpu-mb", "4000"]


def make(**celery: Any) -> Any:
    from vision_api import create_app

    return create_app({"TESTING": True, "CELERY": celery})


@pytest.fixture
def eager_app() -> Any:
    """An eager app on a broker URL where nothing listens, with two in-process GPUs."""
    app = make(task_always_eager=True, broker_url=DEAD_REDIS, result_backend=DEAD_REDIS)
    compass = app.extensions["celery"].compass
    add_worker(compass.app, "gpu0", gpu_mb=16000, resident=["detector"])
    add_worker(compass.app, "gpu1", gpu_mb=16000, resident=["captioner", "translator"])
    return app


def test_the_broker_override_carries_the_result_backend(monkeypatch: Any) -> None:
    monkeypatch.setenv("FLASK_CELERY__broker_url", "redis://elsewhere:6390/2")
    celery = make().extensions["celery"]
    assert celery.conf.broker_url == "redis://elsewhere:6390/2"
    assert celery.conf.result_backend == "redis://elsewhere:6390/2"


def test_eager_job_results_and_placement(eager_app: Any) -> None:
    from compass_celery.state.store import MemoryStateStore

    client = eager_app.test_client()
    res = client.post("/jobs/", json={"image_url": DOG, "lang": "de"})
    assert res.status_code == 202, res.json
    status = client.get(res.json["status_url"])
    assert status.status_code == 200
    body = status.json
    assert body["status"] == "SUCCESS"
    assert body["results"] == {"translate": DOG_DE}
    assert {n: p["worker"] for n, p in body["placement"].items()} == {
        "detect": "gpu0", "caption": "gpu1", "translate": "gpu1"}
    assert all(p["planned"] == p["worker"] for p in body["placement"].values())
    assert isinstance(eager_app.extensions["celery"].compass.store, MemoryStateStore)


def test_eager_jobs_are_kept_per_app(eager_app: Any) -> None:
    job_id = eager_app.test_client().post("/jobs/", json={"image_url": CAT}).json["job_id"]
    assert eager_app.test_client().get(f"/jobs/{job_id}/").json["results"] == {
        "translate": CAT_FR}
    other = make(task_always_eager=True, broker_url=DEAD_REDIS)
    assert other.test_client().get(f"/jobs/{job_id}/").status_code == 404


def test_tasks_keep_the_flask_app_context(eager_app: Any) -> None:
    """Compass(celery_app) keeps the guide's FlaskTask base: tasks run in the app context."""
    import flask

    celery_app = eager_app.extensions["celery"]

    @celery_app.task(name="test.where", shared=False)
    def where() -> str:
        return flask.current_app.name

    assert where.apply().get() == eager_app.name


@pytest.mark.parametrize("body, message", [
    ({}, "image_url"),
    ({"image_url": ""}, "image_url"),
    ({"image_url": CAT, "lang": "xx"}, "lang must be one of fr, de"),
    ([CAT], "JSON object"),
])
def test_bad_requests_are_refused(eager_app: Any, body: Any, message: str) -> None:
    res = eager_app.test_client().post("/jobs/", json=body)
    assert res.status_code == 400
    assert message in res.json["error"]


def test_unknown_job_and_wrong_methods(eager_app: Any) -> None:
    client = eager_app.test_client()
    assert client.get("/jobs/no-such-job/").status_code == 404
    assert client.get("/jobs/").status_code == 405
    assert client.post("/jobs/", data="{not json", content_type="application/json"
                       ).status_code == 400


def test_the_default_app_has_no_search(eager_app: Any) -> None:
    """The emulated models are the default: /search/ (real models) says how to switch."""
    assert eager_app.config["COMPASS_EXAMPLE_MODELS"] == "emulated"
    res = eager_app.test_client().post("/search/", json={"query": "budget"})
    assert res.status_code == 404
    assert "FLASK_COMPASS_EXAMPLE_MODELS=real" in res.json["error"]
    assert "pretrained.speech" not in eager_app.extensions["celery"].tasks


@pytest.mark.redis
def test_job_from_a_flask_view_runs_on_real_workers(compass_redis_url: str,
                                                   compass_workers: Any) -> None:
    """fl0 holds the detector, fl1 the captioner and translator: the job crosses over."""
    url = compass_redis_url
    env = {"PYTHONPATH": pythonpath(FLASK_DIR), "FLASK_CELERY__broker_url": url}
    workers = [
        compass_workers("make_celery", "fl0@example", *EMULATED, "--compass-preload",
                        "detector", env=env),
        compass_workers("make_celery", "fl1@example", *EMULATED, "--compass-preload",
                        "captioner,translator", env=env),
    ]
    wait_live(probe(url), {"fl0@example", "fl1@example"}, workers)

    app = make(broker_url=url, result_backend=url, compass_snapshot_ttl_s=0.0)
    assert not app.extensions["celery"].conf.task_always_eager
    client = app.test_client()
    posted = client.post("/jobs/", json={"image_url": CAT, "lang": "fr"})
    assert posted.status_code == 202, posted.json
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        body = client.get(posted.json["status_url"]).json
        seen.append(body["status"])
        if body["status"] in ("SUCCESS", "FAILURE"):
            break
        time.sleep(0.05)
    assert body["status"] == "SUCCESS", (seen, body, worker_logs(workers))
    assert body["results"] == {"translate": CAT_FR}
    expected = {"detect": "fl0@example", "caption": "fl1@example",
                "translate": "fl1@example"}
    assert {n: p["planned"] for n, p in body["placement"].items()} == expected
    assert {n: p["worker"] for n, p in body["placement"].items()} == expected
    assert set(body["placement"]) == NODES
    for where in body["placement"].values():  # for people: ISO times, whole milliseconds
        assert datetime.fromisoformat(where["started"]).tzinfo is not None
        assert all(isinstance(where[k], int) for k in ("queued_ms", "load_ms", "run_ms"))

    status, results, placement = job_record(probe(url), posted.json["job_id"])
    assert (status, results) == ("SUCCESS", {"translate": CAT_FR})
    assert {n: p["worker"] for n, p in placement.items()} == expected


def test_eager_refuses_a_bad_deadline_and_takes_a_good_one(eager_app: Any) -> None:
    client = eager_app.test_client()
    for body, message in (({"deadline_ms": -5}, "deadline_ms must be a number"),
                          ({"deadline_ms": "soon"}, "deadline_ms must be a number"),
                          ({"slo": "platinum"}, "unknown SLO class 'platinum'")):
        res = client.post("/jobs/", json={"image_url": CAT, **body})
        assert res.status_code == 400 and message in res.json["error"], res.json
    res = client.post("/jobs/", json={"image_url": CAT, "slo": "interactive"})
    assert res.status_code == 202, res.json  # eager mode runs every job


def _poll(client: Any, url: str, timeout: float = 30.0) -> Any:
    """GET ``url`` until the job ends; the last response."""
    deadline = time.monotonic() + timeout
    while True:
        res = client.get(url)
        if res.json.get("status") in ("SUCCESS", "FAILURE") or time.monotonic() > deadline:
            return res
        time.sleep(0.05)


@pytest.mark.redis
def test_a_busy_worker_answers_429_with_retry_after_and_a_late_job_504(
        compass_redis_url: str, compass_workers: Any) -> None:
    """One worker, made busy by a long task: a job whose deadline the plan says cannot
    be met is refused at once (429, Retry-After); one the plan wrongly thought would
    make it is dropped before it runs, and its status answers 504."""
    from tests.examples.busy import HOLD

    url = compass_redis_url
    env = {"PYTHONPATH": pythonpath(FLASK_DIR), "FLASK_CELERY__broker_url": url}
    workers = [compass_workers("make_celery", "fl0@example", *EMULATED, "--compass-preload",
                               "detector,captioner,translator", "--include",
                               "tests.examples.busy", env=env)]
    wait_live(probe(url), {"fl0@example"}, workers)
    app = make(broker_url=url, result_backend=url, compass_snapshot_ttl_s=0.0)
    client = app.test_client()
    hold = app.extensions["celery"].tasks[HOLD]

    idle = client.post("/jobs/", json={"image_url": CAT, "deadline_ms": 5000})
    assert idle.status_code == 202, idle.json  # an idle worker meets it
    assert _poll(client, idle.json["status_url"]).json["status"] == "SUCCESS", \
        worker_logs(workers)

    # 2 s of work the planner is told takes 1 ms: a job with 1 s to go is taken...
    hold.apply_async((2.0,), compass={"exec_ms": 1})
    taken = client.post("/jobs/", json={"image_url": CAT, "deadline_ms": 1000})
    assert taken.status_code == 202, taken.json
    # ...then 3 s of work declared as such, queued behind it: now the plan knows
    hold.apply_async((0.1,), compass={"exec_ms": 3000})
    refused = client.post("/jobs/", json={"image_url": CAT, "deadline_ms": 500})
    assert refused.status_code == 429, refused.json
    assert int(refused.headers["Retry-After"]) >= 2  # about 3 s of work ahead
    body = refused.json
    assert body["error"] == "rejected" and "deadline" in body["reason"]
    assert body["deadline_ms"] == 500 and body["predicted_ms"] > 3000
    assert body["retry_after_s"] > 2 and body["slo"] is None  # a bare deadline: no class

    # the job taken first waited behind the long task past its deadline: dropped unrun
    late = _poll(client, taken.json["status_url"])
    assert late.status_code == 504, (late.json, worker_logs(workers))
    assert late.json["status"] == "FAILURE"
    assert late.json["error"]["exc_type"] == "DeadlineMissed"
    assert "deadline" in late.json["message"]
