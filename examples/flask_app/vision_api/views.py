"""HTTP API: POST /jobs/ submits a job, GET /jobs/<id>/ reports it.

``POST /jobs/`` with ``{"image_url": ..., "lang": "fr"}`` answers 202 with the job id.
``GET /jobs/<id>/`` answers its status (RUNNING, SUCCESS or FAILURE), the results by
node once it succeeded (the error once it failed) and, per node, the worker Compass
planned and the worker it ran on.
"""

from collections import OrderedDict
from typing import Any

from celery import Celery
from flask import Blueprint, current_app, request, url_for

from compass_celery.jobs import JobHandle

from .tasks import LANGUAGES, caption_job

bp = Blueprint("jobs", __name__)
_EAGER_KEEP = 1000

Response = tuple[dict[str, Any], int]


def _celery() -> Celery:
    return current_app.extensions["celery"]


def _eager_jobs() -> OrderedDict[str, Any]:
    """Eager mode (tests, local development) runs a job inline and keeps no record in
    Redis: its handle is kept here, per Flask app, for the status view."""
    return current_app.extensions.setdefault("compass_eager_jobs", OrderedDict())


@bp.post("/jobs/")
def submit() -> Response:
    """Build the caption job from the request body and start it."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return {"error": "the body must be a JSON object"}, 400
    image_url, lang = body.get("image_url"), body.get("lang", "fr")
    if not isinstance(image_url, str) or not image_url:
        return {"error": "image_url (a non-empty string) is required"}, 400
    if lang not in LANGUAGES:
        return {"error": f"lang must be one of {', '.join(LANGUAGES)}"}, 400
    celery_app = _celery()
    job = caption_job(celery_app, image_url, lang).apply_async()
    if celery_app.conf.task_always_eager:
        jobs = _eager_jobs()
        jobs[job.id] = job
        while len(jobs) > _EAGER_KEEP:
            jobs.popitem(last=False)
    return {"job_id": job.id, "status_url": url_for("jobs.status", job_id=job.id)}, 202


@bp.get("/jobs/<job_id>/")
def status(job_id: str) -> Response:
    """The job's state, its results when done, and where each node was placed."""
    celery_app = _celery()
    job: Any = (_eager_jobs().get(job_id) if celery_app.conf.task_always_eager
                else JobHandle(celery_app.compass, job_id))
    if job is None or job.status == "UNKNOWN":
        return {"error": f"no job {job_id}"}, 404
    out: dict[str, Any] = {"job_id": job_id, "status": job.status,
                           "placement": job.placement(readable=True)}
    if out["status"] == "SUCCESS":
        out["results"] = job.get(timeout=0)
    elif out["status"] == "FAILURE":
        out["error"] = job.error
    return out, 200
