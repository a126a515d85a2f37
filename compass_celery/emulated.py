"""Emulated-GPU tasks and their app factory: the demo's and the benchmark's cluster.

Run with ``celery -A compass_celery.emulated_app worker -P solo --compass-emulate-gpu-mb 1600``
(or the example ``workers.emulated``, which is the same app).
Each task sleeps its workload run time (times ``compass_time_scale``) after the
worker's model cache has made its model resident, so a cluster of GPUs is
reproduced honestly on a machine without one. Configured through environment
variables so the benchmark can start many workers from one definition.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery

from compass_celery import Compass
from compass_celery.broker.amqp import is_amqp
from compass_celery.cache import current_cache
from compass_celery.state import keys

logger = logging.getLogger("compass_celery.emulated")

_ledger_client: tuple[int, Any] | None = None

#: The models of dags/edge-vision.json, sizes in MB.
EDGE_MODELS = {
    "detector": 250.0,
    "captioner": 950.0,
    "translator": 300.0,
    "embedder": 420.0,
    "classifier": 100.0,
    "ocr": 600.0,
}

#: The generic task names a workload template's nodes run (:meth:`Dag.from_spec`).
INFER_TASK = "emulated.infer"
STEP_TASK = "emulated.step"


def make_app(broker: str | None = None, *, state_url: str | None = None,
             **conf: Any) -> Celery:
    """A Compass app with the emulated tasks; settings from the environment unless given."""
    app = configured_app("compass_emulated", EDGE_MODELS, broker, state_url=state_url,
                         **conf)
    _register_tasks(app)
    return app


def lazy_app(module: str, factory: Callable[[], Celery]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a ``celery -A module`` entry point: ``app`` is built by
    ``factory`` the first time it is asked for (as ``celery -A`` does), never merely by
    importing the module, and once per process."""
    built: dict[str, Celery] = {}
    lock = threading.Lock()

    def getattr_(name: str) -> Any:
        if name != "app":
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        with lock:
            if "app" not in built:
                built["app"] = factory()
            return built["app"]

    return getattr_


def configured_app(name: str, default_models: dict[str, float], broker: str | None = None,
                   *, state_url: str | None = None, **conf: Any) -> Celery:
    """A Compass app configured from ``COMPASS_*`` environment variables (as the benchmark
    starts its workers), ``conf`` overriding; no tasks yet."""
    env = os.environ
    broker = broker or env.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    state_url = state_url or env.get("COMPASS_REDIS_URL") or None
    # over RabbitMQ, results go to the state Redis (Celery has no amqp:// result backend)
    backend = (state_url or "rpc://") if is_amqp(broker) else broker
    app = Celery(name, broker=broker, backend=backend)
    app.conf.update(
        compass_redis_url=state_url,
        compass_models=json.loads(env.get("COMPASS_MODELS", "null")) or default_models,
        compass_policy=env.get("COMPASS_POLICY", "compass"),
        compass_key_prefix=env.get("COMPASS_KEY_PREFIX", "compass"),
        compass_shared_queue=env.get("COMPASS_SHARED_QUEUE", "compass.shared"),
        compass_queue_prefix=env.get("COMPASS_QUEUE_PREFIX", "compass.w."),
        compass_cache_policy=env.get("COMPASS_CACHE_POLICY", "lookahead"),
        compass_time_scale=float(env.get("COMPASS_TIME_SCALE", "1.0")),
        compass_state_refresh_s=float(env.get("COMPASS_STATE_REFRESH_S", "0.1")),
        compass_heartbeat_timeout_s=float(env.get("COMPASS_HEARTBEAT_TIMEOUT_S", "3.0")),
        compass_reconcile_s=float(env.get("COMPASS_RECONCILE_S", "2.0")),
        compass_priority_age_s=float(env.get("COMPASS_PRIORITY_AGE_S", "10.0")),
        compass_validate=env.get("COMPASS_VALIDATE", "") == "1",
        result_expires=3600,
        broker_transport_options=_transport_options(env),
        broker_connection_retry_on_startup=True,
    )
    app.conf.update(conf)
    Compass(app)
    return app


def _transport_options(env: Any) -> dict[str, Any]:
    """Visibility timeout, and (bench) how often kombu sweeps for expired unacked
    messages: every 10 x 10 s by default, too rare to see a redelivery in a short run."""
    opts: dict[str, Any] = {
        "visibility_timeout": float(env.get("COMPASS_VISIBILITY_TIMEOUT", "3600"))}
    if env.get("COMPASS_RESTORE_INTERVAL_S"):
        opts.update(unacked_restore_interval=float(env["COMPASS_RESTORE_INTERVAL_S"]),
                    unacked_restore_throttle=1)
    return opts


def _ledger() -> Any | None:
    """This process's ledger client (None outside the benchmark); per pid, fork-safe."""
    global _ledger_client
    url = os.environ.get("COMPASS_BENCH_LEDGER_URL")
    if not url:
        return None
    if _ledger_client is None or _ledger_client[0] != os.getpid():
        import redis

        _ledger_client = (os.getpid(), redis.Redis.from_url(url, socket_timeout=5))
    return _ledger_client[1]


def count_execution(task: Any, template: str) -> None:
    """HINCRBY the ledger hash ``template`` (:data:`~compass_celery.state.keys.BENCH_STARTS`
    or :data:`~compass_celery.state.keys.BENCH_EXECS`, in the Redis named by
    ``COMPASS_BENCH_LEDGER_URL``: a private server the faults never touch, so the counts
    survive a broker restart or pause) for this task id, so the benchmark can count
    executions beyond the first; a ledger error is logged and never fails the task."""
    client = _ledger()
    task_id = task.request.id
    if client is None or not task_id:
        return
    try:
        client.hincrby(keys.key(template, task.app.conf.compass_key_prefix), task_id, 1)
    except Exception as exc:  # the ledger is bookkeeping, never the task's outcome
        logger.warning("bench ledger unavailable, execution of %s not counted: %s",
                       task_id, exc)


def _run(self: Any, model: str | None, exec_ms: float, data: Any) -> dict[str, Any]:
    count_execution(self, keys.BENCH_STARTS)
    current_cache().run(exec_ms)
    count_execution(self, keys.BENCH_EXECS)
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
    @app.task(name=INFER_TASK, bind=True, shared=False)
    def infer(self: Any, model: str | None, exec_ms: float, data: Any = None) -> dict:
        """Generic node: the caller passes ``compass={"model": ..., "exec_ms": ...}``."""
        return _run(self, model, exec_ms, data)

    @app.task(name=STEP_TASK, bind=True, shared=False)
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

