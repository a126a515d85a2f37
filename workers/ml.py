"""A real ML worker app: the four example torch models of ``workers.models``, one task each.

Run one worker per device, on a GPU or on the CPU::

    celery -A workers.ml worker -P solo -n gpu0@%h --compass-gpu cuda --compass-preload detector
    celery -A workers.ml worker -P solo -n cpu0@%h --compass-gpu cpu

The worker's model cache makes the task's model resident before the task body runs;
the body then takes it with :func:`get_model` and runs a real forward pass on its JSON
input. Broker (and state store) from ``COMPASS_BROKER_URL``, default
``redis://127.0.0.1:6379/0``. Importing this module needs torch (CPU build is enough)
but never CUDA: models are built by the worker's cache on the worker's device.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery

from compass_celery import Compass
from compass_celery.cache import ModelRegistry, default_registry, get_model
from workers.models import EXAMPLES, register_example_models

log = logging.getLogger(__name__)

#: Task short name -> (model, expected run time in ms): the median forward pass of one
#: input on a 2-core CPU, rounded up (translate: 12 greedy decoding steps). A GPU is
#: faster; Compass refines these from completed runs.
TASKS: dict[str, tuple[str, float]] = {
    "classify": ("image-classifier", 5),
    "detect": ("detector", 8),
    "encode": ("text-encoder", 12),
    "translate": ("translator", 250),
}


def register_models(registry: ModelRegistry = default_registry) -> dict[str, float]:
    """Register the example models into ``registry`` unless already there; name -> MB.

    Idempotent: importing this module again, or next to another app that registered
    them, keeps the specs already in place (same seeded weights) instead of replacing.
    """
    ours = ModelRegistry()
    register_example_models(ours)
    for name in ours.names():
        spec = ours.get(name)
        if name not in registry:
            registry.register(name, spec.loader, spec.size_mb, spec.device)
        elif registry.get(name).size_mb != spec.size_mb:
            log.warning("model %r already registered with %.1f MB, not the example's %.1f MB; "
                        "keeping it", name, registry.get(name).size_mb, spec.size_mb)
    return {name: size_mb for name, (_, size_mb, _) in EXAMPLES.items()}


def make_app(broker: str | None = None, *, state_url: str | None = None,
             **conf: Any) -> Celery:
    """A Compass app with one task per example model; settings from the environment."""
    env = os.environ
    broker = broker or env.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    app = Celery("compass_ml", broker=broker, backend=broker)
    app.conf.update(
        compass_redis_url=state_url or env.get("COMPASS_REDIS_URL") or None,
        compass_models=register_models(),
        compass_key_prefix=env.get("COMPASS_KEY_PREFIX", "compass"),
        compass_state_refresh_s=float(env.get("COMPASS_STATE_REFRESH_S", "0.25")),
        compass_heartbeat_timeout_s=float(env.get("COMPASS_HEARTBEAT_TIMEOUT_S", "5.0")),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        broker_connection_retry_on_startup=True,
    )
    app.conf.update(conf)
    Compass(app)
    _register_tasks(app)
    return app


def _infer(task: Any, data: Sequence[Any], **kw: Any) -> dict[str, Any]:
    """Take the task's resident model and run its forward helper on ``data``."""
    name = task.compass_model
    model = get_model(name)
    t0 = time.perf_counter()
    output = EXAMPLES[name][2](model, data, **kw)
    forward_ms = 1000 * (time.perf_counter() - t0)
    return {"model": name, "worker": task.request.hostname or socket.gethostname(),
            "device": str(next(model.parameters()).device),
            "forward_ms": round(forward_ms, 3), "output": output}


def _register_tasks(app: Celery) -> None:
    model, exec_ms = TASKS["classify"]

    @app.task(name="ml.classify", bind=True, shared=False, compass_model=model,
              compass_exec_ms=exec_ms)
    def classify(self: Any, pixels: Sequence[float], top: int = 3) -> dict[str, Any]:
        """Flat floats (a 3x32x32 image, zero-padded) -> top labels and scores."""
        return _infer(self, pixels, top=int(top))

    model, exec_ms = TASKS["detect"]

    @app.task(name="ml.detect", bind=True, shared=False, compass_model=model,
              compass_exec_ms=exec_ms)
    def detect(self: Any, pixels: Sequence[float], top: int = 5) -> dict[str, Any]:
        """Flat floats (a 3x32x32 image) -> the ``top`` boxes (score, x, y, w, h)."""
        return _infer(self, pixels, top=int(top))

    model, exec_ms = TASKS["encode"]

    @app.task(name="ml.encode", bind=True, shared=False, compass_model=model,
              compass_exec_ms=exec_ms)
    def encode(self: Any, token_ids: Sequence[int]) -> dict[str, Any]:
        """Token ids -> a unit-norm 384-float embedding."""
        return _infer(self, token_ids)

    model, exec_ms = TASKS["translate"]

    @app.task(name="ml.translate", bind=True, shared=False, compass_model=model,
              compass_exec_ms=exec_ms)
    def translate(self: Any, token_ids: Sequence[int], max_len: int = 12) -> dict[str, Any]:
        """Token ids -> greedy-decoded token ids (at most ``max_len``, stops at EOS)."""
        return _infer(self, token_ids, max_len=int(max_len))


app = make_app()
