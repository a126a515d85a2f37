"""Run the Django example's ``POST /search/`` in eager mode with the real models, in this
process (Django's settings are process-global: the test runs this as a child process
with ``COMPASS_EXAMPLE_MODELS=real``), and print everything seen as one JSON object.

    python -m tests.examples.django_search_driver [--search]

Without ``--search`` only the refusals are checked (no model is loaded).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from .helpers import BAD_SEARCHES, DEAD_REDIS, SEARCH_QUERY


def main(search: bool) -> dict[str, Any]:
    """POST each bad body, then (with ``search``) one search and its status."""
    os.environ.update({"DJANGO_SETTINGS_MODULE": "proj.settings",
                       "COMPASS_EXAMPLE_MODELS": "real", "CELERY_TASK_ALWAYS_EAGER": "1",
                       "CELERY_BROKER_URL": DEAD_REDIS, "CELERY_RESULT_BACKEND": DEAD_REDIS})
    import django

    django.setup()
    from django.test import Client
    from proj.celery import app

    from compass_celery.testing import add_worker

    client = Client()
    out: dict[str, Any] = {"bad": [], "get_search": client.get("/search/").status_code}
    for body, _ in BAD_SEARCHES:
        res = client.post("/search/", body, content_type="application/json")
        out["bad"].append([res.status_code, res.json().get("error")])
    res = client.post("/search/", b"{not json", content_type="application/json")
    out["not_json"] = [res.status_code, res.json().get("error")]
    if search:
        add_worker(app, "cpu0", gpu_mb=200)  # the worker command's --compass-device-mb
        post = client.post("/search/", {"query": SEARCH_QUERY}, content_type="application/json")
        out.update(post_code=post.status_code, post=post.json())
        res = client.get(out["post"]["status_url"])
        out.update(status_code=res.status_code, final=res.json())
    return out


if __name__ == "__main__":
    print(json.dumps(main("--search" in sys.argv[1:])))
