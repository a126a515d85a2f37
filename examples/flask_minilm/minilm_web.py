"""The web side: a Flask app that answers within a 400 ms SLO or says why not.

``POST /embed`` ``{"text": ...}`` -> ``{"embedding": [...]}`` (the batched task);
``POST /search`` ``{"query": ...}`` -> ``{"hits": [...]}`` (a two-node job: embed the
query, then rank the documents). Both ask for ``slo="interactive"`` (400 ms): a request
the plan says would miss is answered 429 with ``Retry-After`` at once, one that fell
behind 504. Run it from this folder with ``flask --app minilm_web run``.
"""

from __future__ import annotations

from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from flask import Flask, jsonify, request
from minilm_tasks import app as celery_app
from minilm_tasks import embed, rank

from compass_celery import Dag, DeadlineMissed, Rejected

#: How long a view waits for a result it was promised within the SLO (it is dropped
#: past its deadline, so this only bounds a lost worker).
WAIT_S = 5.0

app = Flask(__name__)


def _text(field: str) -> str:
    body = request.get_json(silent=True)
    text = body.get(field) if isinstance(body, dict) else None
    if not isinstance(text, str) or not text.strip() or len(text) > 500:
        raise ValueError(f"{field} must be a non-empty string of at most 500 characters")
    return text


def _answer(run: Any) -> Any:
    """Run ``run()`` and turn compass's outcomes into HTTP answers."""
    try:
        return jsonify(run()), 200
    except ValueError as exc:
        return jsonify({"error": str(exc)}), 400
    except Rejected as exc:
        return jsonify({"error": "rejected", "reason": str(exc)}), 429, {
            "Retry-After": str(exc.retry_after)}
    except (DeadlineMissed, TimeoutError, CeleryTimeout) as exc:
        return jsonify({"error": "late", "reason": str(exc)}), 504


@app.post("/embed")
def embed_view() -> Any:
    """One text's embedding, from the batched task."""
    def run() -> dict[str, Any]:
        result = embed.apply_async((_text("text"),), slo="interactive")
        return {"embedding": result.get(timeout=WAIT_S)}
    return _answer(run)


@app.post("/search")
def search_view() -> Any:
    """The documents closest to a query: embed it, then rank, as one planned job."""
    def run() -> dict[str, Any]:
        dag = Dag(celery_app, "search")
        query = dag.node("query", embed.s(_text("query")))
        dag.node("rank", rank.s(), after=[query])
        job = dag.apply_async(slo="interactive")
        return {"hits": job.get(timeout=WAIT_S)["rank"]}
    return _answer(run)
