"""Operations hooks: Prometheus metrics, a placement log, and Flower's task formatter.

* :func:`install_metrics` counts the Compass signals of *this process* (producers
  see placements, workers see model loads); :func:`serve_metrics` exposes them.
* :class:`CompassStateCollector` exports the cluster state at scrape time; one
  process (Flower) should register it, not every worker.
* :func:`install_decision_log` records each message's ``compass`` header in a
  capped Redis hash by task id, because Flower never sees message headers;
  :func:`format_task` (Flower's ``format_task`` option) reads it back.

prometheus_client is optional: ``pip install 'compass-celery[metrics]'``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from celery import signals as celery_signals

from . import signals
from .placement import Decision
from .state import StateStore, connect

logger = logging.getLogger("compass_celery.monitoring")

METRICS_HINT = "pip install 'compass-celery[metrics]'"
PLACEMENTS_KEY = "{p}:placements"          # hash: task id -> Decision JSON
PLACEMENTS_ORDER_KEY = "{p}:placements:order"  # zset: task id -> time recorded (for the cap)
RETRY_AFTER_S = 30.0

# Capped insert: re-recording an id (a re-placed retry) moves it to the newest end.
_RECORD_LUA = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do redis.call('HDEL', KEYS[1], old[i]) end
end
return over
"""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError("compass-celery metrics need prometheus_client: "
                          f"{METRICS_HINT}") from exc
    return prometheus_client


# -- counters and histograms fed by signals ------------------------------------------
MB = 1024 * 1024  # compass sizes are MiB; Prometheus wants bytes


class CompassMetrics:
    """The signal-fed metrics of one registry; :meth:`disconnect` stops counting."""

    def __init__(self, registry: Any = None) -> None:
        pc = _prometheus()
        self.registry = pc.REGISTRY if registry is None else registry
        r = self.registry
        self.placed = pc.Counter("compass_tasks_placed", "Tasks placed by Compass",
                                 ["policy", "worker", "fallback"], registry=r)
        self.reassigned = pc.Counter("compass_tasks_reassigned",
                                     "Successors moved by the adjustment phase", registry=r)
        self.loads = pc.Counter("compass_model_loads", "Models loaded onto a worker's GPU",
                                ["worker", "model"], registry=r)
        self.evictions = pc.Counter("compass_model_evictions", "Models evicted from a GPU",
                                    ["worker", "model"], registry=r)
        # Prometheus conventions: base units (seconds, bytes) in the metric names
        self.est_finish = pc.Histogram(
            "compass_placement_estimated_finish_seconds",
            "Estimated finish of placed tasks, from placement",
            buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60), registry=r)
        self.load_seconds = pc.Histogram(
            "compass_model_load_seconds", "Measured model load time",
            buckets=(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 120), registry=r)
        self._uid = f"compass-metrics-{id(r)}"
        self._pairs: list[tuple[Any, Callable[..., None]]] = [
            (signals.task_placed, self._on_placed), (signals.task_reassigned, self._on_moved),
            (signals.model_loaded, self._on_loaded), (signals.model_evicted, self._on_evicted)]
        for sig, fn in self._pairs:
            sig.connect(fn, weak=False, dispatch_uid=f"{self._uid}-{sig.name}")

    def disconnect(self) -> None:
        for sig, fn in self._pairs:
            sig.disconnect(fn, dispatch_uid=f"{self._uid}-{sig.name}")
        _INSTALLED.pop(id(self.registry), None)

    # Handlers stay trivial; celery's Signal.send logs anything they raise.
    def _on_placed(self, sender: Any = None, decision: Decision | None = None,
                   **kw: Any) -> None:
        if decision is None:
            return
        self.placed.labels(decision.policy, decision.worker,
                           "true" if decision.fallback else "false").inc()
        if not decision.fallback:
            self.est_finish.observe(max(0.0, float(decision.est_finish_ms)) / 1000.0)

    def _on_moved(self, sender: Any = None, **kw: Any) -> None:
        self.reassigned.inc()

    def _on_loaded(self, sender: Any = None, model: Any = None, ms: Any = None, **kw: Any
                   ) -> None:
        self.loads.labels(str(sender), str(model)).inc()
        if ms is not None:
            self.load_seconds.observe(max(0.0, float(ms)) / 1000.0)

    def _on_evicted(self, sender: Any = None, model: Any = None, **kw: Any) -> None:
        self.evictions.labels(str(sender), str(model)).inc()


_INSTALLED: dict[int, CompassMetrics] = {}
_LOCK = threading.Lock()


def install_metrics(registry: Any = None) -> CompassMetrics:
    """Count this process's Compass signals into ``registry`` (default: the global one).

    Idempotent per registry. Signals are process-local: call it in the processes
    that place tasks (producers) and run them (workers).
    """
    key = id(_prometheus().REGISTRY if registry is None else registry)
    with _LOCK:
        if key not in _INSTALLED:
            _INSTALLED[key] = CompassMetrics(registry)
        return _INSTALLED[key]


def serve_metrics(port: int, addr: str = "0.0.0.0") -> CompassMetrics:
    """:func:`install_metrics` on the default registry and serve it on ``addr:port``."""
    metrics = install_metrics()
    _prometheus().start_http_server(port, addr)
    return metrics


def serve_metrics_in_worker(port: int | None = None) -> None:
    """Serve metrics from each worker's main process (``-P solo``) once it starts.

    ``port`` defaults to ``$COMPASS_METRICS_PORT``; nothing happens without one,
    so producers that import the app module open no port.
    """
    port = port or int(os.environ.get("COMPASS_METRICS_PORT", "0") or 0)
    if port:
        celery_signals.worker_init.connect(lambda **kw: serve_metrics(port), weak=False,
                                           dispatch_uid="compass-worker-metrics")


# -- cluster state at scrape time -----------------------------------------------------
class CompassStateCollector:
    """Gauges per live worker from one snapshot per scrape; never raises at scrape."""

    GAUGES = (("backlog_seconds", "Queued and running work"),
              ("pending_seconds", "Planned work not yet sent"),
              ("gpu_free_bytes", "Free GPU memory"), ("gpu_total_bytes", "GPU memory"),
              ("resident_models", "Models resident in GPU memory"),
              ("heartbeat_age_seconds", "Time since the worker's last beat (Redis's clock)"))

    def __init__(self, store: StateStore, heartbeat_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.timeout_s, self.clock = store, heartbeat_timeout_s, clock

    def describe(self) -> list[Any]:
        return []  # no Redis round trip when a registry checks names at register time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily as Gauge

        up = Gauge("compass_state_up", "1 if the Compass state store answered this scrape")
        try:
            snap = self.store.snapshot(self.clock(), self.timeout_s)
        except Exception as exc:  # a scrape must not fail because Redis blinked
            logger.warning("compass metrics: state unavailable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        live = Gauge("compass_workers_live", "Workers with a fresh heartbeat")
        live.add_metric([], len(snap.workers))
        skipped = Gauge("compass_worker_records_skipped", "Records skipped: dead or garbled")
        skipped.add_metric([], len(snap.skipped))
        info = Gauge("compass_worker_info", "Worker queue and device (value 1)",
                     labels=["worker", "queue", "device"])
        fams = {k: Gauge(f"compass_worker_{k}", doc, labels=["worker"]) for k, doc in self.GAUGES}
        for w in snap.workers:
            info.add_metric([w.name, w.queue, str(w.device or "")], 1)
            values = {"backlog_seconds": w.backlog_ms / 1000.0,
                      "pending_seconds": w.pending_ms / 1000.0,
                      "gpu_free_bytes": w.gpu_free_mb * MB, "gpu_total_bytes": w.gpu_total_mb * MB,
                      "resident_models": len(w.resident),
                      "heartbeat_age_seconds": max(0.0, snap.taken_at - w.heartbeat)}
            for key, value in values.items():
                fams[key].add_metric([w.name], float(value))
        yield from (live, skipped, info, *fams.values())


# -- placement log: task id -> Decision -----------------------------------------------
class DecisionLog:
    """Decisions by task id, capped at ``cap`` (oldest dropped); in Redis, or in memory
    when the URL is None. Redis trouble never propagates: it pauses the log for 30 s.

    ``resolve`` (instead of ``url``/``prefix``) defers reading them to first use.
    """

    def __init__(self, url: str | None = None, prefix: str = "compass", cap: int = 100_000,
                 client_factory: Callable[[str], Any] = connect, *,
                 resolve: Callable[[], tuple[str | None, str]] | None = None) -> None:
        self.url, self.prefix, self.cap, self._factory = url, prefix, cap, client_factory
        self._resolve = resolve
        self._memory: OrderedDict[str, Decision] = OrderedDict()
        self._pid, self._client, self._script = -1, None, None
        self._down_until = 0.0

    @property
    def keys(self) -> list[str]:
        self._ready()
        return [PLACEMENTS_KEY.format(p=self.prefix), PLACEMENTS_ORDER_KEY.format(p=self.prefix)]

    def _ready(self) -> bool:
        """True when backed by Redis (after resolving the deferred URL once)."""
        if self._resolve is not None:
            self.url, self.prefix = self._resolve()
            self._resolve = None
        return self.url is not None

    def _redis(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = self._factory(self.url)  # type: ignore[arg-type]
            self._script = self._client.register_script(_RECORD_LUA)
            self._pid = os.getpid()
        return self._client

    def _guard(self, fn: Callable[[], Any]) -> Any:
        if time.monotonic() < self._down_until:
            return None
        try:
            return fn()
        except Exception as exc:
            self._down_until = time.monotonic() + RETRY_AFTER_S
            logger.warning("compass decision log paused %.0fs: %s", RETRY_AFTER_S, exc)
            return None

    def record(self, task_id: str, decision: Decision) -> None:
        if not self._ready():
            self._memory.pop(task_id, None)
            self._memory[task_id] = decision
            while len(self._memory) > self.cap:
                self._memory.popitem(last=False)
            return
        body = json.dumps(decision.as_header())

        def go() -> Any:
            self._redis()
            return self._script(keys=self.keys,  # type: ignore[misc]
                                args=[task_id, body, time.time(), self.cap])
        self._guard(go)

    def get(self, task_id: str) -> Decision | None:
        if not self._ready():
            return self._memory.get(task_id)
        raw = self._guard(lambda: self._redis().hget(self.keys[0], task_id))
        try:
            return Decision.from_header(json.loads(raw)) if raw else None
        except ValueError:
            return None


def install_decision_log(app: Any, cap: int = 100_000) -> DecisionLog:
    """Record each published task's ``compass`` header (router and job placements alike).

    Call after ``Compass(app)``, whose listener sets the header first. Costs one Redis
    call per publish; producers need write access to ``{prefix}:placements*``.
    """
    compass = getattr(app, "compass", None)
    if compass is None:
        raise RuntimeError("call Compass(app) before install_decision_log(app)")
    log = DecisionLog(cap=cap, resolve=lambda: (
        None if compass.eager else compass.redis_url, compass.settings["key_prefix"]))

    def on_publish(sender: Any = None, headers: dict | None = None, **kw: Any) -> None:
        headers = headers or {}
        decision = Decision.from_header(headers.get("compass"))
        if decision is not None and headers.get("id"):
            log.record(str(headers["id"]), decision)

    celery_signals.before_task_publish.connect(on_publish, weak=False,
                                               dispatch_uid=f"compass-decisions-{id(app)}")
    return log


# -- Flower -----------------------------------------------------------------------------
_FLOWER: dict[str, Any] = {}


def describe_decision(d: Decision) -> str:
    """One line: where a task was placed and why."""
    if d.fallback:
        return f"shared queue {d.queue} (fallback: {d.reason or 'no reason given'})"
    where = "shared queue" if d.worker == "*" else f"worker {d.worker}"
    return (f"{where} (queue {d.queue}) by {d.policy}: {d.reason or 'no reason given'}; "
            f"est. finish {d.est_finish_ms:.0f} ms = wait {d.wait_ms:.0f} + "
            f"load {d.load_ms:.0f} + run {d.run_ms:.0f}")


def format_task(task: Any) -> Any:
    """Flower's ``format_task``: append where and why Compass placed ``task`` to its kwargs.

    Flower shows only fixed task fields, so the note rides on ``kwargs`` (detail page
    and the kwargs column). It never raises; without a recorded decision it names
    the routing key when Flower knows it (``task_send_sent_event``).
    """
    try:
        log: DecisionLog | None = _FLOWER.get("log")
        decision = log.get(task.uuid) if log is not None else None
        if decision is not None:
            note = describe_decision(decision)
        elif getattr(task, "routing_key", None):
            note = f"queue {task.routing_key} (no decision recorded)"
        else:
            return task
        kwargs = getattr(task, "kwargs", None)
        task.kwargs = f"{kwargs}  [compass: {note}]" if kwargs else f"[compass: {note}]"
    except Exception as exc:  # Flower would log it per row; keep the page usable
        logger.debug("compass format_task: %s", exc)
    return task


def configure_flower(redis_url: str | None, prefix: str = "compass",
                     heartbeat_timeout_s: float = 5.0, registry: Any = None
                     ) -> Callable[[Any], Any]:
    """For a Flower config file: state gauges into the (default) registry that Flower
    serves at /metrics, and the decision log for :func:`format_task`, which it returns.
    Idempotent; opens no connection until the first scrape or page."""
    from .state import RedisStateStore

    pc = _prometheus()
    registry = pc.REGISTRY if registry is None else registry
    _FLOWER["log"] = DecisionLog(redis_url, prefix)
    if redis_url and id(registry) not in _FLOWER.setdefault("registries", set()):
        registry.register(CompassStateCollector(RedisStateStore(redis_url, prefix),
                                                heartbeat_timeout_s))
        _FLOWER["registries"].add(id(registry))
    return format_task
