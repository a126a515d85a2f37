"""A user's app whose own loader builds a packaged sentence-transformers model, as a user
writes it: ``SentenceTransformer(model_path(...))``, with no compass helper around it."""

from __future__ import annotations

import os

from celery import Celery

from compass_celery import Compass, model
from compass_celery.pretrained import model_path


@model("user-minilm", size_mb=91)
def load_user_minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path("all-MiniLM-L6-v2"), device="cpu")


def make_app(broker: str | None = None) -> Celery:
    """The app, on ``broker`` (else ``COMPASS_BROKER_URL``)."""
    broker = broker or os.environ.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    app = Celery("hf", broker=broker, backend=broker, set_as_current=False)
    Compass(app)
    return app


app = make_app()
