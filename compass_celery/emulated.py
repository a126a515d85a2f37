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
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from celery import Celery

from compass_celery import Compass
from compass_celery.broker.amqp import is_amqp
from compass_celery.cache import current_cache
from compass_celery.planner.batch import BatchSpec, batch_record, batch_spec
from compass_celery.state import keys

if TYPE_CHECKING:
    from compass_celery.planner.types import DagSpec

logger = logging.getLogger("compass_celery.emulated")
T = TypeVar("T")

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

#: The batched tasks of a workload's batched nodes (:func:`batched_tasks`), as JSON: how
#: the benchmark tells the workers it starts which tasks to register.
BATCHED_ENV = "COMPASS_BATCHED_TASKS"
#: List in the benchmark's ledger: ``[size, held ms]`` per batched pass (workload ms), so
#: that batch sizes and the latency of holding a batch open are counted without a hook in
#: the worker.
BENCH_BATCHES = "{p}:bench:batches"


def make_app(broker: str | None = None, *, state_url: str | None = None,
             batched: Mapping[str, Mapping[str, Any]] | None = None, **conf: Any) -> Celery:
    """A Compass app with the emulated tasks; settings from the environment unless given.
    ``batched`` (default: ``COMPASS_BATCHED_TASKS``) adds a workload's batched tasks."""
    app = configured_app("compass_emulated", EDGE_MODELS, broker, state_url=state_url,
                         **conf)
    _register_tasks(app)
    _register_batched(app, batched_from_env() if batched is None else batched)
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
        # batched tasks: whether workers batch, and whether placement counts forming batches
        compass_batching=env.get("COMPASS_BATCHING", "1") != "0",
        compass_batch_aware=env.get("COMPASS_BATCH_AWARE", "1") != "0",
        result_expires=3600,
        broker_transport_options=_transport_options(env),
        broker_connection_retry_on_startup=True,
    )
    if env.get("COMPASS_PRELOAD"):  # models resident from the start (a warm cluster)
        app.conf.compass_preload = env["COMPASS_PRELOAD"]
    if env.get("COMPASS_ATOMIC_FETCH"):  # take each message in one atomic step
        app.conf.compass_atomic_fetch = env["COMPASS_ATOMIC_FETCH"] == "1"
    if env.get("COMPASS_HOLD_MAX_MS"):  # the held slot's bound (worker.core)
        app.conf.compass_hold_max_ms = float(env["COMPASS_HOLD_MAX_MS"])
    if env.get("COMPASS_PREFETCH_POLL_S"):  # 0: peek the queue only when a task starts
        app.conf.compass_prefetch_poll_s = float(env["COMPASS_PREFETCH_POLL_S"])
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
        client.hincrby(keys.key(template, task.app.compass.settings.key_prefix), task_id, 1)
    except Exception as exc:  # the ledger is bookkeeping, never the task's outcome
        logger.warning("bench ledger unavailable, execution of %s not counted: %s",
                       task_id, exc)


def counted(task: Any, run: Callable[[], T]) -> T:
    """``run()``, counted in the ledger as :func:`count_execution` counts it (a start
    before, an execution after) in one round trip, not two: the start's HINCRBY is sent
    before the run and its reply read with the end's, so a task killed mid-run is still
    counted as started (Redis has the command) and both counts are in before the task
    returns. The worker times the run with this in it, and the simulator replays what
    the workers measured: each ledger round trip is one more per task."""
    client = _ledger()
    task_id = task.request.id
    if client is None or not task_id:
        return run()
    prefix = task.app.compass.settings.key_prefix
    pool, conn = client.connection_pool, None
    try:
        conn = pool.get_connection()
        conn.send_command("HINCRBY", keys.key(keys.BENCH_STARTS, prefix), task_id, 1)
    except Exception as exc:  # the ledger is bookkeeping, never the task's outcome
        if conn is not None:
            conn.disconnect()
            pool.release(conn)
            conn = None
        logger.warning("bench ledger unavailable, start of %s not counted: %s", task_id, exc)
    try:
        out = run()
    except BaseException:
        if conn is not None:  # the start's reply unread: the connection starts over
            conn.disconnect()
            pool.release(conn)
        raise
    if conn is None:
        count_execution(task, keys.BENCH_EXECS)
        return out
    try:
        conn.send_command("HINCRBY", keys.key(keys.BENCH_EXECS, prefix), task_id, 1)
        conn.read_response()
        conn.read_response()
    except Exception as exc:
        conn.disconnect()
        logger.warning("bench ledger unavailable, execution of %s not counted: %s",
                       task_id, exc)
    finally:
        pool.release(conn)
    return out


def _run(self: Any, model: str | None, exec_ms: float, data: Any) -> dict[str, Any]:
    counted(self, lambda: current_cache().run(exec_ms))
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



# -- batched tasks (a workload node that declares ``batch``) ---------------------------------
def batched_tasks(dags: Mapping[str, DagSpec], namespace: str
                  ) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str]]:
    """The task each batched node of a workload's templates runs, and which node runs which.

    Batches form per task and model, so nodes with the same model, run time and batch
    declaration share one task (``embed`` in two templates batches together); it is named
    ``<namespace>.batched.<node>`` after the first such node. Returns ``({task: {"model",
    "exec_ms", "batch"}}, {(template, node): task})``; both empty without batched nodes."""
    tasks: dict[str, dict[str, Any]] = {}
    by_spec: dict[str, str] = {}
    nodes: dict[tuple[str, str], str] = {}
    for dag_name, dag in dags.items():
        for node, t in dag.nodes.items():
            if t.batch is None:
                continue
            spec = {"model": t.model, "exec_ms": t.exec_ms, "batch": batch_fields(t.batch)}
            key = json.dumps(spec, sort_keys=True)
            if key not in by_spec:
                name, i = f"{namespace}.batched.{node}", 2
                while name in tasks:
                    name, i = f"{namespace}.batched.{node}-{i}", i + 1
                by_spec[key], tasks[name] = name, spec
            nodes[(dag_name, node)] = by_spec[key]
    return tasks, nodes


def batch_fields(spec: BatchSpec) -> dict[str, Any]:
    """A :class:`BatchSpec` back as the ``compass_batch`` option that declares it."""
    return {k: v for k, v in (batch_record(spec) or {}).items() if k != "key"}


def batched_from_env() -> dict[str, dict[str, Any]]:
    """The batched tasks named by ``COMPASS_BATCHED_TASKS`` (none when unset)."""
    return json.loads(os.environ.get(BATCHED_ENV) or "null") or {}


class BatchTimed:
    """Mixed into a batched task's class: notes when the worker entered the call, so the
    body can tell how long the batch was held open for more inputs before it ran."""

    _compass_called: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._compass_called = time.monotonic()
        return super().__call__(*args, **kwargs)  # type: ignore[misc]


def timed_base(app: Celery) -> type:
    """``app``'s task class with :class:`BatchTimed` mixed in."""
    return type("BatchedTask", (BatchTimed, app.Task), {"__module__": __name__})


def held_ms(task: Any) -> float:
    """Workload ms from the worker entering ``task``'s call to now (the body's start):
    the batch's forming (claims, and waiting for more while one forms)."""
    called = getattr(task, "_compass_called", None)
    if called is None:
        return 0.0
    scale = float(task.app.conf.get("compass_time_scale") or 1.0)
    return (time.monotonic() - called) * 1000.0 / scale


def record_batch(task: Any, size: int, hold_ms: float) -> None:
    """RPUSH ``[size, hold_ms]`` onto the benchmark ledger's :data:`BENCH_BATCHES` (no-op
    outside the benchmark); a ledger error is logged and never fails the batch."""
    client = _ledger()
    if client is None:
        return
    try:
        client.rpush(keys.key(BENCH_BATCHES, task.app.compass.settings.key_prefix),
                     json.dumps([size, round(hold_ms, 3)]))
    except Exception as exc:  # bookkeeping, never the tasks' outcome
        logger.warning("bench ledger unavailable, batch of %d not recorded: %s", size, exc)


def counted_pass(task: Any, n: int, run: Callable[[], T]) -> T:
    """``run()``, one batched pass over ``n`` inputs, as the benchmark's ledger counts it:
    its start and end, then its size and how long it was held open for more inputs."""
    hold = held_ms(task)
    out = counted(task, run)
    record_batch(task, n, hold)
    return out


def _register_batched(app: Celery, tasks: Mapping[str, Mapping[str, Any]]) -> None:
    """One emulated batched task per entry of :func:`batched_tasks`: a pass over n inputs
    sleeps the curve's run time for n (times the time scale) with the model resident, as
    a single emulated task sleeps its ``exec_ms``; one result per input."""
    for name, spec in tasks.items():
        raw, exec_ms = dict(spec["batch"]), float(spec["exec_ms"])
        curve = batch_spec(raw, exec_ms).curve_for(exec_ms)

        def body(self: Any, inputs: list[Any], _curve: Any = curve) -> list[dict[str, Any]]:
            run_ms = _curve.of(len(inputs))
            counted_pass(self, len(inputs), lambda: current_cache().run(run_ms))
            worker = self.request.hostname or socket.gethostname()
            return [{"model": self.compass_model, "worker": worker, "batch": len(inputs),
                     "exec_ms": round(run_ms / len(inputs), 3), "data": _lineage(x)}
                    for x in inputs]

        app.task(name=name, bind=True, shared=False, base=timed_base(app),
                 compass_model=spec["model"], compass_exec_ms=exec_ms,
                 compass_batch=raw)(body)
