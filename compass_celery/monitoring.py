"""Prometheus metrics: what this process did, and the cluster's state at scrape time.

* :func:`install_metrics` counts the Compass signals of *this process* (producers
  see placements, workers see model loads); :func:`serve_metrics` exposes them.
* :class:`CompassStateCollector` exports the cluster state at scrape time, and
  ``compass_workers_needed``, the workers the current demand needs to meet the SLOs
  (for an autoscaler: :mod:`compass_celery.planner.capacity`); one process (Flower,
  through :func:`register_state_collector`) should register it, not every worker.

Flower shows each task's placement without help from here: it rides on the
message's ``kwargsrepr`` (:func:`compass_celery.flower.annotate_headers`).

prometheus_client is optional: ``pip install 'compass-celery[metrics]'``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from celery import signals as celery_signals

from . import signals
from .admission import NO_CLASS as ADMISSION_NO_CLASS
from .needs import learned_loads
from .placement import Decision
from .planner.capacity import tightest_deadline_ms, workers_needed
from .planner.types import ClusterView
from .state.store import StateStore

logger = logging.getLogger("compass_celery.monitoring")

METRICS_HINT = "pip install 'compass-celery[metrics]'"


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError("compass-celery metrics need prometheus_client: "
                          f"{METRICS_HINT}") from exc
    return prometheus_client


# -- counters and histograms fed by signals ------------------------------------------
MB = 10**6  # compass sizes are in MB (10^6 bytes); Prometheus wants bytes
#: The ``slo`` label of work with no SLO class (a bare ``deadline_ms``, or no deadline):
#: the class its refusals are counted under in the state store too.
NO_CLASS = ADMISSION_NO_CLASS


def slo_label(slo: Any) -> str:
    """An SLO class name for a label, from an ``Slo`` or a name; :data:`NO_CLASS` if none."""
    name = getattr(slo, "name", slo)
    return str(name) if name else NO_CLASS


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
        # Deadlines: what admission took and refused, what workers dropped, what made it.
        self.admitted = pc.Counter("compass_admission_admitted",
                                   "Jobs and tasks admitted (late ones included)", ["slo"],
                                   registry=r)
        self.late = pc.Counter("compass_admission_late",
                               "Admitted although the plan said they would miss the deadline",
                               ["slo"], registry=r)
        self.rejected = pc.Counter("compass_admission_rejected",
                                   "Refused at submission, per SLO class and cause: "
                                   "deadline, queue_full or cold (planner.admission)",
                                   ["slo", "reason"], registry=r)
        self.shed = pc.Counter("compass_tasks_shed",
                               "Dropped unrun: starting them could no longer meet the deadline",
                               ["slo"], registry=r)
        self.deadline_jobs = pc.Counter("compass_deadline_jobs",
                                        "Jobs with a deadline that succeeded: met or missed it",
                                        ["slo", "outcome"], registry=r)
        self._uid = f"compass-metrics-{id(r)}"
        self._pairs: list[tuple[Any, Callable[..., None]]] = [
            (signals.task_placed, self._on_placed), (signals.task_reassigned, self._on_moved),
            (signals.model_loaded, self._on_loaded), (signals.model_evicted, self._on_evicted),
            (signals.admission_decided, self._on_admission), (signals.task_shed, self._on_shed),
            (signals.job_deadline_outcome, self._on_outcome)]
        for sig, fn in self._pairs:
            sig.connect(fn, weak=False, dispatch_uid=f"{self._uid}-{sig.name}")

    def disconnect(self) -> None:
        """Stop counting: disconnect the signal handlers and forget this registry."""
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

    def _on_admission(self, sender: Any = None, slo: Any = None, verdict: Any = None,
                      **kw: Any) -> None:
        if verdict is None:
            return
        label = slo_label(slo)
        if not verdict.admitted:
            self.rejected.labels(label, verdict.cause or verdict.kind or "deadline").inc()
            return
        self.admitted.labels(label).inc()
        if verdict.late:
            self.late.labels(label).inc()

    def _on_shed(self, sender: Any = None, slo: Any = None, **kw: Any) -> None:
        self.shed.labels(slo_label(slo)).inc()

    def _on_outcome(self, sender: Any = None, slo: Any = None, met: Any = None,
                    **kw: Any) -> None:
        self.deadline_jobs.labels(slo_label(slo), "met" if met else "missed").inc()


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
              ("hop_seconds", "The worker's own cost per task, learned between tasks"),
              ("gpu_free_bytes", "Free GPU memory"), ("gpu_total_bytes", "GPU memory"),
              ("resident_models", "Models resident in GPU memory"),
              ("heartbeat_age_seconds", "Time since the worker's last beat (Redis's clock)"))

    def __init__(self, store: StateStore, heartbeat_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 model_sizes_mb: Mapping[str, float] | None = None,
                 slo_classes: Mapping[str, Any] | None = None) -> None:
        """``model_sizes_mb`` (the catalogue) and ``slo_classes`` (``compass_slo_classes``,
        added to the defaults: the tightest deadline sets the headroom) feed
        ``compass_workers_needed``."""
        self.store, self.timeout_s, self.clock = store, heartbeat_timeout_s, clock
        self.model_sizes_mb = dict(model_sizes_mb or {})
        self.deadline_ms = tightest_deadline_ms(slo_classes)

    def describe(self) -> list[Any]:
        """Nothing up front, so registering the collector needs no Redis round trip."""
        return []  # no Redis round trip when a registry checks names at register time

    def collect(self) -> Iterator[Any]:
        """The gauges of one snapshot; only ``compass_state_up`` 0 if Redis is down."""
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
                      "hop_seconds": w.hop_ms / 1000.0,
                      "gpu_free_bytes": w.gpu_free_mb * MB, "gpu_total_bytes": w.gpu_total_mb * MB,
                      "resident_models": len(w.resident),
                      "heartbeat_age_seconds": max(0.0, snap.taken_at - w.heartbeat)}
            for key, value in values.items():
                fams[key].add_metric([w.name], float(value))
        yield from (live, skipped, info, *fams.values())
        yield from self._capacity(snap)

    def _capacity(self, snap: Any) -> Iterator[Any]:
        """``compass_workers_needed`` and the terms behind it (planner.capacity)."""
        from prometheus_client.core import GaugeMetricFamily as Gauge

        view = ClusterView.of(snap.workers, self.model_sizes_mb, snap.taken_at,
                              load_ms=learned_loads(snap.profiles))
        need = workers_needed(view, self.deadline_ms)
        for name, doc, value in (
                ("compass_workers_needed", "Workers the current demand needs to meet the "
                 "tightest SLO (for an autoscaler)", need.workers),
                ("compass_demand_busy_workers", "GPU work asked per second, in workers "
                 "kept busy (1 = one worker all the time)", need.work_ms_per_s / 1000.0),
                ("compass_capacity_target_utilization", "Share of each worker's time "
                 "planned for, so queueing stays within the tightest deadline",
                 need.target_util)):
            gauge = Gauge(name, doc)
            gauge.add_metric([], float(value))
            yield gauge


_REGISTERED: set[int] = set()


def register_state_collector(redis_url: str | None, prefix: str = "compass",
                             heartbeat_timeout_s: float = 5.0, registry: Any = None,
                             model_sizes_mb: Mapping[str, float] | None = None,
                             slo_classes: Mapping[str, Any] | None = None) -> None:
    """For one process of the deployment (Flower's config file, say): add the cluster-state
    gauges to ``registry`` (the default one, which Flower serves at /metrics). Idempotent;
    opens no connection until the first scrape. ``model_sizes_mb`` and ``slo_classes``
    as in :class:`CompassStateCollector`."""
    from .state.store import RedisStateStore

    pc = _prometheus()
    registry = pc.REGISTRY if registry is None else registry
    if redis_url and id(registry) not in _REGISTERED:
        registry.register(CompassStateCollector(RedisStateStore(redis_url, prefix),
                                                heartbeat_timeout_s,
                                                model_sizes_mb=model_sizes_mb,
                                                slo_classes=slo_classes))
        _REGISTERED.add(id(registry))


def register_app_state_collector(app: Any, registry: Any = None) -> bool:
    """:func:`register_state_collector` with a Compass app's own state Redis, key prefix,
    heartbeat timeout, model catalogue and SLO classes; False when nothing was registered:
    ``app`` has no Compass, or no state Redis (an eager app), so the caller can fall back
    to its environment."""
    compass = getattr(app, "compass", None)
    if compass is None or not compass.redis_url:
        return False
    register_state_collector(compass.redis_url, prefix=compass.settings.key_prefix,
                             heartbeat_timeout_s=compass.settings.heartbeat_timeout_s,
                             registry=registry, model_sizes_mb=compass.model_sizes(),
                             slo_classes=compass.settings.slo_classes)
    return True
