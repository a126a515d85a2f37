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
EDGE_MODELS = {
    "detector": 250.0,
    "captioner": 950.0,
    "translator": 300.0,
    "embedder": 420.0,
    "classifier": 100.0,
    "ocr": 600.0,
}

def make_app(broker: str | None = None, *, state_url: str | None = None,
             **conf: Any) -> Celery:
    """A Compass app with the emulated tasks; settings from the environment unless given."""
    env = os.environ
    broker = broker or env.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    app = Celery("compass_emulated", broker=broker, backend=broker)
    app.conf.update(
        compass_redis_url=state_url or env.get("COMPASS_REDIS_URL") or None,
        compass_models=json.loads(env.get("COMPASS_MODELS", "null")) or EDGE_MODELS,
        compass_policy=env.get("COMPASS_POLICY", "compass"),
        compass_key_prefix=env.get("COMPASS_KEY_PREFIX", "compass"),
        compass_shared_queue=env.get("COMPASS_SHARED_QUEUE", "compass.shared"),
        compass_queue_prefix=env.get("COMPASS_QUEUE_PREFIX", "compass.w."),
        compass_cache_policy=env.get("COMPASS_CACHE_POLICY", "lookahead"),
        compass_time_scale=float(env.get("COMPASS_TIME_SCALE", "1.0")),
        compass_state_refresh_s=float(env.get("COMPASS_STATE_REFRESH_S", "0.1")),
        compass_heartbeat_timeout_s=float(env.get("COMPASS_HEARTBEAT_TIMEOUT_S", "3.0")),
        compass_reconcile_s=float(env.get("COMPASS_RECONCILE_S", "2.0")),
        compass_validate=env.get("COMPASS_VALIDATE", "") == "1",
        result_expires=3600,
        broker_transport_options={
            "visibility_timeout": float(env.get("COMPASS_VISIBILITY_TIMEOUT", "3600"))},
        broker_connection_retry_on_startup=True,
    )
    app.conf.update(conf)
    Compass(app)
    _register_tasks(app)
    return app


def _run(self: Any, model: str | None, exec_ms: float, data: Any) -> dict[str, Any]:
    current_cache().run(exec_ms)
    return {"model": model, "worker": self.request.hostname or socket.gethostname(),
            "exec_ms": exec_ms, "data": data}


def _lineage(inputs: Any) -> Any:
    """What reached a node: the data of its inputs, kept small and checkable in tests."""
    if isinstance(inputs, list):
        return [_lineage(i) for i in inputs]
    return inputs.get("data") if isinstance(inputs, dict) else inputs


#: Declared tasks: name -> (model, expected run time in ms), as in edge-vision.
DECLARED = {"detect": ("detector", 30), "caption": ("captioner", 120),
            "translate": ("translator", 60), "embed": ("embedder", 40),
            "classify": ("classifier", 15), "ocr": ("ocr", 90)}


def _register_tasks(app: Celery) -> None:
    @app.task(name="emulated.infer", bind=True, shared=False)
    def infer(self: Any, model: str | None, exec_ms: float, data: Any = None) -> dict:
        """Generic node: the caller passes ``compass={"model": ..., "exec_ms": ...}``."""
        return _run(self, model, exec_ms, data)

    @app.task(name="emulated.step", bind=True, shared=False)
    def step(self: Any, inputs: Any, model: str | None, exec_ms: float) -> dict:
        """A DAG node after others: ``inputs`` is its predecessors' output(s)."""
        return _run(self, model, exec_ms, _lineage(inputs))

    for short, (model, exec_ms) in DECLARED.items():
        def body(self: Any, data: Any = None) -> dict:
            return _run(self, self.compass_model, self.compass_exec_ms, data)

        app.task(name=f"emulated.{short}", bind=True, shared=False, compass_model=model,
                 compass_exec_ms=exec_ms)(body)

    @app.task(name="emulated.plain", shared=False)
    def plain(x: int) -> int:
        """A task without compass options: routed exactly as Celery would."""
        return x * 2


app = make_app()
