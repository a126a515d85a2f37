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
voice search on the real models when ``COMPASS_EXAMPLE_MODELS = "real"`` (otherwise it
answers 404, saying how to switch); the same status view reports it.
"""

import json
from collections import OrderedDict
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from proj.celery import REAL_MODELS
from proj.celery import app as celery_app

from compass_celery import Dag
from compass_celery.admission import SloInputError
from compass_celery.errors import DeadlineMissed, JobFailed, Rejected
from compass_celery.jobs import JobHandle
from compass_celery.pretrained.app import voice_search
from compass_celery.pretrained.web import BadSearch, parse_search

from .tasks import LANGUAGES, caption_job

# Eager mode (tests, local development) runs a job inline and keeps no record in Redis:
# its handle is kept here, in this process, for the status view.
_EAGER_JOBS: OrderedDict[str, Any] = OrderedDict()
_EAGER_KEEP = 1000


#: What ``POST /search/`` answers while the app runs the emulated models.
SWITCH_TO_REAL = ("/search/ runs the real models and this app runs the emulated ones: "
                  "pip install -e '.[examples,real]', then set COMPASS_EXAMPLE_MODELS=real "
                  "for the web app and its workers")


def _bad_request(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400)


def _json_body(request: HttpRequest) -> Any:
    """The request's JSON body (an empty body reads as ``{}``); ValueError if not JSON."""
    return json.loads(request.body or b"{}")


def _deadline(body: Any) -> dict[str, Any]:
    """The request's optional ``deadline_ms`` and ``slo``, as ``Dag.apply_async`` takes
    them (compass checks the values: a bad one raises SloInputError)."""
    body = body if isinstance(body, dict) else {}
    return {k: body[k] for k in ("deadline_ms", "slo") if body.get(k) is not None}


def _rejected(exc: Rejected) -> JsonResponse:
    """429 Too Many Requests: the workers cannot answer in time now; ``Retry-After`` says
    when the capacity the job lacks frees up."""
    res = JsonResponse({"error": "rejected", "reason": exc.reason, "slo": exc.slo or None,
                        "deadline_ms": exc.deadline_ms, "predicted_ms": exc.predicted_ms,
                        "retry_after_s": round(exc.retry_after_s, 3)}, status=429)
    res["Retry-After"] = str(exc.retry_after)
    return res


def _start(dag: Dag, body: Any = None) -> JsonResponse:
    """Submit the job and answer 202 with its id and status URL; 429 when admission
    refuses it (its deadline cannot be met now), 400 for a bad deadline or SLO class."""
    try:
        job = dag.apply_async(**_deadline(body))
    except Rejected as exc:
        return _rejected(exc)
    except SloInputError as exc:
        return _bad_request(str(exc))
    if celery_app.conf.task_always_eager:
        _EAGER_JOBS[job.id] = job
        while len(_EAGER_JOBS) > _EAGER_KEEP:
            _EAGER_JOBS.popitem(last=False)
    return JsonResponse({"job_id": job.id, "status_url": reverse("status", args=[job.id])},
                        status=202)


@require_POST
def submit(request: HttpRequest) -> JsonResponse:
    """Build the caption job from the request body and start it."""
    try:
        body = _json_body(request)
    except ValueError:
        return _bad_request("the body must be JSON")
    if not isinstance(body, dict):
        return _bad_request("the body must be a JSON object")
    image_url, lang = body.get("image_url"), body.get("lang", "fr")
    if not isinstance(image_url, str) or not image_url:
        return _bad_request("image_url (a non-empty string) is required")
    if lang not in LANGUAGES:
        return _bad_request(f"lang must be one of {', '.join(LANGUAGES)}")
    return _start(caption_job(celery_app, image_url, lang), body)


@require_POST
def search(request: HttpRequest) -> JsonResponse:
    """Rank the example clip's spoken transcript lines against the query (real models)."""
    if not REAL_MODELS:
        return JsonResponse({"error": SWITCH_TO_REAL}, status=404)
    try:
        body = _json_body(request)
    except ValueError:
        return _bad_request("the body must be JSON")
    try:
        query, lines = parse_search(body)
    except BadSearch as exc:
        return _bad_request(str(exc))
    return _start(voice_search(celery_app, query, lines=lines), body)


@require_GET
def status(request: HttpRequest, job_id: str) -> JsonResponse:
    """The job's state, its results when done, and where each node was placed."""
    job: Any = (_EAGER_JOBS.get(job_id) if celery_app.conf.task_always_eager
                else JobHandle(celery_app.compass, job_id))
    if job is None or job.status == "UNKNOWN":
        return JsonResponse({"error": f"no job {job_id}"}, status=404)
    out: dict[str, Any] = {"job_id": job_id, "status": job.status,
                           "placement": job.placement(readable=True)}
    if out["status"] in ("SUCCESS", "FAILURE"):
        try:
            out["results"] = job.get(timeout=0)
        except DeadlineMissed as exc:  # dropped unrun: the answer would have come too late
            out.update(error=job.error, message=str(exc))
            return JsonResponse(out, status=504)
        except JobFailed:
            out["error"] = job.error
    return JsonResponse(out)
