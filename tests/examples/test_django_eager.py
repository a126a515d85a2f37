"""The Django example in eager mode: Django's test client, no Redis at all.

Compass places every node against in-process workers declared with ``add_worker``;
the views answer with the job's results and those placements.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from compass_celery.testing import add_worker

from .helpers import CAT, CAT_FR, DEAD_REDIS, DJANGO_DIR, DOG, DOG_DE, NODES

pytest.importorskip("django")


@pytest.fixture(scope="module")
def celery_app() -> Any:
    """The project's Celery app, set up once per process as Django is (eager, and a
    broker URL where nothing listens); the environment is restored afterwards."""
    import django
    from django.conf import settings

    if settings.configured and os.environ.get("DJANGO_SETTINGS_MODULE") != "proj.settings":
        pytest.skip("Django is already configured with other settings in this process")
    if str(DJANGO_DIR) not in sys.path:
        sys.path.insert(0, str(DJANGO_DIR))
    env = {"DJANGO_SETTINGS_MODULE": "proj.settings", "CELERY_TASK_ALWAYS_EAGER": "1",
           "CELERY_BROKER_URL": DEAD_REDIS, "CELERY_RESULT_BACKEND": DEAD_REDIS}
    saved = {k: os.environ.get(k) for k in [*env, "COMPASS_EXAMPLE_MODELS"]}
    os.environ.update(env)
    os.environ.pop("COMPASS_EXAMPLE_MODELS", None)  # the default: the emulated models
    try:
        django.setup()
        from proj.celery import app
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert app.conf.task_always_eager, "the eager tests need the eager settings"
    return app


@pytest.fixture
def client(celery_app: Any) -> Iterator[Any]:
    """Django's test client, with the in-process cluster emptied before each test."""
    from django.test import Client

    store = celery_app.compass.store
    for name in list(store.records):
        store.remove(name)
    yield Client()


def submit(client: Any, **body: Any) -> dict[str, Any]:
    res = client.post("/jobs/", body, content_type="application/json")
    assert res.status_code == 202, res.content
    return res.json()


def test_job_runs_where_its_models_are_resident(celery_app: Any, client: Any) -> None:
    add_worker(celery_app, "gpu0", gpu_mb=16000,
                                  resident=["detector", "captioner", "translator"])
    add_worker(celery_app, "gpu1", gpu_mb=16000)
    posted = submit(client, image_url=CAT)
    assert posted["status_url"] == f"/jobs/{posted['job_id']}/"
    res = client.get(posted["status_url"])
    assert res.status_code == 200
    body = res.json()
    assert body["status"] == "SUCCESS"
    assert body["results"] == {"translate": CAT_FR}
    assert set(body["placement"]) == NODES
    for node, where in body["placement"].items():
        assert where["planned"] == where["worker"] == "gpu0", node
        assert where["moved"] is False


def test_each_node_follows_its_model(celery_app: Any, client: Any) -> None:
    add_worker(celery_app, "gpu0", gpu_mb=16000, resident=["detector"])
    add_worker(celery_app, "gpu1", gpu_mb=16000, resident=["captioner", "translator"])
    body = client.get(submit(client, image_url=DOG, lang="de")["status_url"]).json()
    assert body["results"] == {"translate": DOG_DE}
    workers = {n: p["worker"] for n, p in body["placement"].items()}
    assert workers == {"detect": "gpu0", "caption": "gpu1", "translate": "gpu1"}


def test_no_redis_was_opened(celery_app: Any, client: Any) -> None:
    from compass_celery.state.store import MemoryStateStore

    add_worker(celery_app, "gpu0", gpu_mb=16000)
    body = client.get(submit(client, image_url=CAT)["status_url"]).json()
    assert body["status"] == "SUCCESS"
    assert isinstance(celery_app.compass.store, MemoryStateStore)
    assert celery_app.conf.broker_url == DEAD_REDIS  # nothing listens there


@pytest.mark.parametrize("body, message", [
    ({}, "image_url"),
    ({"image_url": ""}, "image_url"),
    ({"image_url": 7}, "image_url"),
    ({"image_url": CAT, "lang": "xx"}, "lang must be one of fr, de"),
    ([CAT], "JSON object"),
])
def test_bad_requests_are_refused(client: Any, body: Any, message: str) -> None:
    res = client.post("/jobs/", body, content_type="application/json")
    assert res.status_code == 400
    assert message in res.json()["error"]


def test_the_default_project_has_no_search(celery_app: Any, client: Any) -> None:
    """The emulated models are the default: /search/ (real models) says how to switch."""
    from django.conf import settings

    assert settings.COMPASS_EXAMPLE_MODELS == "emulated"
    res = client.post("/search/", {"query": "budget"}, content_type="application/json")
    assert res.status_code == 404
    assert "COMPASS_EXAMPLE_MODELS=real" in res.json()["error"]
    assert "pretrained.speech" not in celery_app.tasks


def test_unknown_job_and_wrong_methods(client: Any) -> None:
    assert client.get("/jobs/no-such-job/").status_code == 404
    assert client.get("/jobs/").status_code == 405
    assert client.post("/jobs/abc/").status_code == 405
    assert client.post("/jobs/", b"{not json", content_type="application/json"
                       ).status_code == 400
