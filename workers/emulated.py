"""An emulated-GPU worker app: the demo's and the benchmark's cluster.

Run with ``celery -A workers.emulated worker -P solo --compass-emulate-gpu-mb 1600``.
Each task sleeps its workload run time (times ``compass_time_scale``) after the
worker's model cache has made its model resident, so a cluster of GPUs is
reproduced honestly on a machine without one. Configured through environment
variables so the benchmark can start many workers from one definition.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from celery import Celery

from compass_celery import Compass
from compass_celery.cache import current_cache

#: The models of ../shared/workloads/edge-vision.json, sizes in MB.
EDGE_MODELS = {"detector": 250.0, "captioner": 950.0, "translator": 300.0,
               "embedder": 420.0, "classifier": 100.0, "ocr": 600.0}

BROKER = os.environ.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("compass_emulated", broker=BROKER, backend=BROKER)
app.conf.update(
    compass_models=json.loads(os.environ.get("COMPASS_MODELS", "null")) or EDGE_MODELS,
    compass_policy=os.environ.get("COMPASS_POLICY", "compass"),
    compass_key_prefix=os.environ.get("COMPASS_KEY_PREFIX", "compass"),
    compass_time_scale=float(os.environ.get("COMPASS_TIME_SCALE", "1.0")),
    compass_state_refresh_s=float(os.environ.get("COMPASS_STATE_REFRESH_S", "0.1")),
    compass_heartbeat_timeout_s=float(os.environ.get("COMPASS_HEARTBEAT_TIMEOUT_S", "3.0")),
    compass_reconcile_s=float(os.environ.get("COMPASS_RECONCILE_S", "2.0")),
    result_expires=3600,
    broker_connection_retry_on_startup=True,
)
compass = Compass(app)


def _run(self: Any, model: str | None, exec_ms: float, data: Any) -> dict[str, Any]:
    cache = current_cache()
    cache.run(exec_ms)
    return {"model": model, "worker": self.request.hostname or socket.gethostname(),
            "exec_ms": exec_ms, "data": data}


@app.task(name="emulated.infer", bind=True)
def infer(self: Any, model: str | None, exec_ms: float, data: Any = None) -> dict[str, Any]:
    """Generic node: the caller passes ``compass={"model": ..., "exec_ms": ...}``."""
    return _run(self, model, exec_ms, data)


@app.task(name="emulated.detect", bind=True, compass_model="detector", compass_exec_ms=30)
def detect(self: Any, data: Any = None) -> dict[str, Any]:
    return _run(self, "detector", self.compass_exec_ms, data)


@app.task(name="emulated.caption", bind=True, compass_model="captioner", compass_exec_ms=120)
def caption(self: Any, data: Any = None) -> dict[str, Any]:
    return _run(self, "captioner", self.compass_exec_ms, data)


@app.task(name="emulated.translate", bind=True, compass_model="translator", compass_exec_ms=60)
def translate(self: Any, data: Any = None) -> dict[str, Any]:
    return _run(self, "translator", self.compass_exec_ms, data)


@app.task(name="emulated.embed", bind=True, compass_model="embedder", compass_exec_ms=40)
def embed(self: Any, data: Any = None) -> dict[str, Any]:
    return _run(self, "embedder", self.compass_exec_ms, data)


@app.task(name="emulated.plain")
def plain(x: int) -> int:
    """A task without compass options: routed exactly as Celery would."""
    return x * 2
