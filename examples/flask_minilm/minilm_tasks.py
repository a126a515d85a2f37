"""The Celery side of the MiniLM web app: the packaged all-MiniLM-L6-v2 as a batched task
(``embed``) and a ranking step (``rank``), built as the README and the models and batching
guides say. Start two CPU workers from this folder::

    celery -A minilm_tasks worker -P solo -n cpu0@%h --compass-gpu cpu --compass-preload minilm
    celery -A minilm_tasks worker -P solo -n cpu1@%h --compass-gpu cpu --compass-preload minilm
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from compass_celery import Compass, get_model, model

redis_url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
app = Celery("minilm", broker=redis_url, backend=redis_url)
Compass(app)                      # before the tasks are defined

#: What /search ranks the query against.
DOCUMENTS = [
    "the quarterly budget review moves to thursday",
    "the cat knocked a glass of water off the table",
    "finance moved the budget meeting to friday",
    "the train to the airport leaves every twenty minutes",
    "please bring the slides for the product demo",
]


@model("minilm", size_mb=91)
def load_minilm() -> Any:
    """The packaged all-MiniLM-L6-v2 (the ``real`` extra), on the CPU."""
    from compass_celery.pretrained import load_sentence_transformer, model_path

    return load_sentence_transformer(model_path("all-MiniLM-L6-v2"))


@app.task(name="minilm.embed", compass_model="minilm", compass_exec_ms=12,
          compass_batch={"max_size": 32, "max_wait_ms": 5})
def embed(texts: list[str]) -> list[list[float]]:
    """``embed.delay(text)`` -> its unit-length embedding (384 floats); a worker embeds
    every text waiting for it in one forward pass."""
    vectors = get_model("minilm").encode(texts, normalize_embeddings=True)
    return [[round(float(x), 6) for x in v] for v in vectors]


_document_vectors: dict[int, Any] = {}


@app.task(name="minilm.rank", compass_model="minilm", compass_exec_ms=2)
def rank(query: list[float], top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` documents closest to a query's embedding, best first, with their
    cosine similarity (the documents are embedded once per worker)."""
    import numpy as np

    net = get_model("minilm")
    if id(net) not in _document_vectors:
        _document_vectors[id(net)] = net.encode(DOCUMENTS, normalize_embeddings=True)
    scores = _document_vectors[id(net)] @ np.asarray(query, dtype=np.float32)
    best = np.argsort(-scores)[:top]
    return [{"text": DOCUMENTS[i], "score": round(float(scores[i]), 4)} for i in best]
