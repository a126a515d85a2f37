"""HTTP API: POST /jobs/ submits a job, GET /jobs/<id>/ reports it.

``POST /jobs/`` with ``{"image_url": ..., "lang": "fr"}`` answers 202 with the job id.
``GET /jobs/<id>/`` answers its status (RUNNING, SUCCESS or FAILURE), the results by
node once it succeeded (the error once it failed) and, per node, the worker Compass
planned and the worker it ran on.
"""

import json
from collections import OrderedDict
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from proj.celery import app as celery_app

from compass_celery.jobs import JobHandle

from .tasks import LANGUAGES, caption_job

# Eager mode (tests, local development) runs a job inline and keeps no record in Redis:
# its handle is kept here, in this process, for the status view.
_EAGER_JOBS: OrderedDict[str, Any] = OrderedDict()
_EAGER_KEEP = 1000


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


@require_POST
def submit(request: HttpRequest) -> JsonResponse:
    """Build the caption job from the request body and start it."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return _bad_request("the body must be JSON")
    if not isinstance(body, dict):
        return _bad_request("the body must be a JSON object")
    image_url, lang = body.get("image_url"), body.get("lang", "fr")
    if not isinstance(image_url, str) or not image_url:
        return _bad_request("image_url (a non-empty string) is required")
    if lang not in LANGUAGES:
        return _bad_request(f"lang must be one of {', '.join(LANGUAGES)}")
    job = caption_job(celery_app, image_url, lang).apply_async()
    if celery_app.conf.task_always_eager:
        _EAGER_JOBS[job.id] = job
        while len(_EAGER_JOBS) > _EAGER_KEEP:
            _EAGER_JOBS.popitem(last=False)
    return JsonResponse({"job_id": job.id, "status_url": reverse("status", args=[job.id])},
                        status=202)


@require_GET
def status(request: HttpRequest, job_id: str) -> JsonResponse:
    """The job's state, its results when done, and where each node was placed."""
    job: Any = (_EAGER_JOBS.get(job_id) if celery_app.conf.task_always_eager
                else JobHandle(celery_app.compass, job_id))
    if job is None or job.status == "UNKNOWN":
        return JsonResponse({"error": f"no job {job_id}"}, status=404)
    out: dict[str, Any] = {"job_id": job_id, "status": job.status,
                           "placement": job.placement(readable=True)}
    if out["status"] == "SUCCESS":
        out["results"] = job.get(timeout=0)
    elif out["status"] == "FAILURE":
        out["error"] = job.error
    return JsonResponse(out)
