"""HTTP API: POST /jobs/ submits a job, GET /jobs/<id>/ reports it.

``POST /jobs/`` with ``{"image_url": ..., "lang": "fr"}`` answers 202 with the job id.
An optional ``"deadline_ms"`` (from now) or ``"slo"`` (an SLO class, e.g.
"interactive") gives the job a deadline: when the plan says the workers cannot meet it,
the job is refused at once with 429 and a ``Retry-After`` header (seconds until the
capacity it lacks frees up), and nothing is queued.
``GET /jobs/<id>/`` answers its status (RUNNING, SUCCESS or FAILURE), the results by
node once it succeeded (the error once it failed; 504 when it was dropped because it
could no longer meet its deadline) and, per node, the worker Compass planned and the
worker it ran on. ``POST /search/`` with ``{"query": ...}`` starts a
voice search on the real models when ``COMPASS_EXAMPLE_MODELS`` is "real" (otherwise it
answers 404, saying how to switch); the same status view reports it.
"""

from collections import OrderedDict
from typing import Any

from celery import Celery
from flask import Blueprint, current_app, request, url_for

from compass_celery import Dag
from compass_celery.admission import SloInputError
from compass_celery.errors import DeadlineMissed, JobFailed, Rejected
from compass_celery.jobs import JobHandle
from compass_celery.pretrained.app import voice_search
from compass_celery.pretrained.web import BadSearch, parse_search

from .tasks import LANGUAGES, caption_job

bp = Blueprint("jobs", __name__)
_EAGER_KEEP = 1000

#: What ``POST /search/`` answers while the app runs the emulated models.
SWITCH_TO_REAL = ("/search/ runs the real models and this app runs the emulated ones: "
                  "pip install -e '.[examples,real]', then set "
                  "FLASK_COMPASS_EXAMPLE_MODELS=real (the COMPASS_EXAMPLE_MODELS config "
                  "key) for the web app and its workers")

Response = tuple[dict[str, Any], int] | tuple[dict[str, Any], int, dict[str, str]]


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
    return _start(caption_job(_celery(), image_url, lang), body)


@bp.post("/search/")
def search() -> Response:
    """Rank the example clip's spoken transcript lines against the query (real models)."""
    if current_app.config.get("COMPASS_EXAMPLE_MODELS") != "real":
        return {"error": SWITCH_TO_REAL}, 404
    try:
        query, lines = parse_search(request.get_json(silent=True))
    except BadSearch as exc:
        return {"error": str(exc)}, 400
    return _start(voice_search(_celery(), query, lines=lines), request.get_json(silent=True))


def _deadline(body: Any) -> dict[str, Any]:
    """The request's optional ``deadline_ms`` and ``slo``, as ``Dag.apply_async`` takes
    them (compass checks the values: a bad one raises SloInputError)."""
    body = body if isinstance(body, dict) else {}
    return {k: body[k] for k in ("deadline_ms", "slo") if body.get(k) is not None}


def _rejected(exc: Rejected) -> Response:
    """429 Too Many Requests: the workers cannot answer in time now; ``Retry-After`` says
    when the capacity the job lacks frees up."""
    return ({"error": "rejected", "reason": exc.reason, "slo": exc.slo or None,
             "deadline_ms": exc.deadline_ms, "predicted_ms": exc.predicted_ms,
             "retry_after_s": round(exc.retry_after_s, 3)},
            429, {"Retry-After": str(exc.retry_after)})


def _start(dag: Dag, body: Any = None) -> Response:
    """Submit the job and answer 202 with its id and status URL; 429 when admission
    refuses it (its deadline cannot be met now), 400 for a bad deadline or SLO class."""
    try:
        job = dag.apply_async(**_deadline(body))
    except Rejected as exc:
        return _rejected(exc)
    except SloInputError as exc:
        return {"error": str(exc)}, 400
    if _celery().conf.task_always_eager:
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
    if out["status"] in ("SUCCESS", "FAILURE"):
        try:
            out["results"] = job.get(timeout=0)
        except DeadlineMissed as exc:  # dropped unrun: the answer would have come too late
            out.update(error=job.error, message=str(exc))
            return out, 504
        except JobFailed:
            out["error"] = job.error
    return out, 200
