"""Run the Django example's API in this process with Django's test client, against
the Redis in ``CELERY_BROKER_URL``: POST a job, poll its status until it ends, print
everything seen as one JSON object. The Redis test runs it as the "web" process.

    python -m tests.examples.django_driver IMAGE_URL LANG
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(image_url: str, lang: str, timeout: float = 60.0) -> dict:
    """POST the job, then GET its status until SUCCESS or FAILURE (or ``timeout``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    import django

    django.setup()
    from django.test import Client

    client = Client()
    post = client.post("/jobs/", {"image_url": image_url, "lang": lang},
                       content_type="application/json")
    out: dict = {"post_code": post.status_code, "post": post.json(), "seen": []}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = client.get(out["post"]["status_url"])
        body = res.json()
        out["seen"].append(body.get("status"))
        out["status_code"], out["final"] = res.status_code, body
        if body.get("status") in ("SUCCESS", "FAILURE"):
            break
        time.sleep(0.05)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
