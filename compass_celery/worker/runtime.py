"""The worker runtime: publishes this worker's record and keeps its backlog and cache honest.

Started and stopped by the :class:`~compass_celery.worker.bootstep.CompassWorker` bootstep.
Between the two it publishes the worker's state, reconciles its backlog from its
queue, renews the leases of what it runs, judges dead peers (recovery), keeps
unusable messages in the dead-letter list, and, on a clean stop, hands its queue
back to the live workers. Per-task hooks live in :mod:`compass_celery.worker.task_path`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery import signals
from redis import RedisError

from ..broker.kombu_redis import RedisLayout, message_headers, peek
from ..cache import EmulatedBackend, ModelCache, TorchBackend, set_current_cache
from ..jobs.runtime import JobRuntime
from ..placement import Decision, cluster_view
from ..planner.types import ClusterView, WorkerView
from ..state.store import StateUnavailable
from .recovery import hand_back, lease_timeout_s, mark_alive, mark_dead, recover, take_back
from .served import RankFollower, ServedDemand
from .task_path import TaskHooks

if TYPE_CHECKING:
    from ..context import CompassContext

logger = logging.getLogger("compass_celery.worker")


class WorkerRuntime(TaskHooks):
    """Publishes this worker's record and keeps its backlog and cache honest."""

    def __init__(self, compass: CompassContext, name: str, queue: str,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.compass, self.name, self.queue = compass, name, queue
        # a worker's retries are placed on fresh state: its reader reads before deciding, not
        # ahead (said before the reader exists, so it is still made where first used)
        compass.reads_ahead = False
        if "reader" in vars(compass):
            compass.reader.refresh_ahead_s = compass.reader.keep_fresh_s = 0.0
            compass.reader.prepare = None
        self.cfg = {**compass.settings, **(overrides or {})}
        if isinstance(self.cfg["preload"], str):
            self.cfg["preload"] = [m for m in self.cfg["preload"].split(",") if m]
        self._wake, self._prefetch_due = threading.Event(), threading.Event()
        self.cache = self._make_cache()
        self.served = ServedDemand(self.cfg["speed"], self.cfg["time_scale"])
        self.rank = RankFollower(self.cache, self._cluster)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        # task id -> (its decision, the model acquired for it, when it started running)
        self._running: dict[str, tuple[Decision | None, str | None, float]] = {}
        self._timing: dict[str, dict[str, float]] = {}
        self.jobs = JobRuntime(compass, name) if compass.store.client is not None else None
        self._lock = threading.Lock()
        self._state_down, self._published = False, None
        self._last_publish_ok = 0.0
        # Since when our own publishes have succeeded without a break (monotonic); a
        # worker judges peers only after a full heartbeat timeout of that, so after a
        # Redis outage every live peer has re-published before anyone is called dead.
        self._publish_ok_since: float | None = None
        # task id -> delivery tag of messages received and not yet finished (leased)
        self._tags: dict[str, str] = {}
        self._exited = threading.Event()  # set by tests that tear a runtime down
        self._born = time.time()

    # -- construction -----------------------------------------------------------
    def _make_cache(self) -> ModelCache:
        cfg, sizes = self.cfg, self.compass.model_sizes()
        if cfg["emulate_gpu_mb"]:
            backend: Any = EmulatedBackend(cfg["emulate_gpu_mb"], cfg["load_mb_per_s"],
                                           cfg["host_load_mb_per_s"], cfg["time_scale"],
                                           host_capacity_mb=cfg["emulate_host_mb"])
        elif (device := cfg["gpu"] or _default_device()) is None:
            logger.warning("compass: torch is not installed; worker %s can only run tasks "
                           "that need no model (pip install 'compass-celery[torch]')", self.name)
            backend = EmulatedBackend(1.0, time_scale=0.0, device="cpu-no-torch")
        else:
            backend = TorchBackend(device)
            if not device.startswith("cuda"):
                logger.warning("compass: worker %s has no GPU; running models on cpu",
                               self.name)
        return ModelCache(backend, policy=cfg["cache_policy"], lookahead=cfg["prefetch_depth"],
                          sizes=sizes, on_change=self._wake.set, on_event=self._on_cache_event)

    def view(self) -> WorkerView:
        """This worker's record as the planner sees it: memory, resident models, speeds."""
        c = self.cache
        return WorkerView(
            name=self.name, queue=self.queue, device=c.device,
            gpu_total_mb=c.total_mb, gpu_free_mb=max(0.0, c.free_mb),
            resident=frozenset(c.resident()), host_resident=frozenset(c.host_resident()),
            speed=self.cfg["speed"], load_mb_per_s=self.cfg["load_mb_per_s"],
            host_load_mb_per_s=self.cfg["host_load_mb_per_s"],
            # liveness is the beat Redis stamps on every publish; the record's own time
            # stays fixed, so an unchanged record is byte-identical and readers reuse it
            net_mb_per_s=self.cfg["net_mb_per_s"], heartbeat=self._born,
            served=self.served.published())

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Preload, publish, take back what a previous run left in flight, start the loops."""
        set_current_cache(self.cache)
        if self.cfg["metrics_port"]:  # first, so the preload's model loads are counted
            self._serve_metrics(int(self.cfg["metrics_port"]))
        if self.cfg["preload"]:
            self.cache.preload(self.cfg["preload"])
        self.publish()
        try:
            self._reconcile()
        except (StateUnavailable, RedisError, OSError) as exc:
            logger.warning("compass: %s", exc)
        if self.jobs is not None:
            try:
                mark_alive(self.compass, self.queue)
                taken = take_back(self.compass, self.name)
                if taken:
                    logger.warning("compass: took back %d task(s) a previous %s left in "
                                   "flight", taken, self.name)
            except (StateUnavailable, RedisError) as exc:
                logger.warning("compass: could not take back in-flight tasks: %s", exc)
        self._connect_signals()
        loops = [(self._publish_loop, "publisher"), (self._reconcile_loop, "reconciler"),
                 (self._prefetch_loop, "prefetch")]
        queues = self.compass.queues
        if self.jobs is not None:  # Redis-backed: watch for dead peers, lease what runs
            loops.append((self._watchdog_loop, "watchdog"))
        if self.jobs is not None and queues is not None and not queues.returns_unacked:
            lease = threading.Thread(target=self._lease_loop, name="compass-leases",
                                     daemon=True)
            lease.start()  # not joined at stop: leases outlive the consumer until exit
        for target, label in loops:
            t = threading.Thread(target=target, name=f"compass-{label}", daemon=True)
            t.start()
            self._threads.append(t)
        logger.info("compass: worker %s consuming %s on %s (%.0f MB)", self.name, self.queue,
                    self.cache.device, self.cache.total_mb)

    def stop(self) -> None:
        """Runs once the consumer has stopped: leave the cluster and hand back the queue.

        The record goes first, so producers stop choosing this worker; the queue
        name joins the dead-queue set, so anything that still lands in it (a
        producer's stale snapshot, a prefetched message kombu restores when the
        connection closes) is drained by the recovery leader.
        """
        self._stopping.set()
        self._wake.set()
        self._prefetch_due.set()  # (its loop sees the stop and skips the peek)
        self._disconnect_signals()
        for t in self._threads:
            t.join(timeout=2)
        try:
            self.compass.store.remove(self.name)
            if self.jobs is not None:
                mark_dead(self.compass, self.queue)
                self.compass.reader.invalidate()
                moved = hand_back(self.compass, self.name)
                logger.warning("compass: worker %s stopping: handed back %d queued task(s)",
                               self.name, moved)
        except (StateUnavailable, RedisError) as exc:
            logger.warning("compass: could not hand back the queue of %s (%s); the "
                           "recovery leader drains it after the heartbeat timeout",
                           self.name, exc)
        set_current_cache(None)

    def _serve_metrics(self, port: int) -> None:
        """Prometheus metrics from this process: compass counters, histograms and the
        process collectors of the default registry, at http://<host>:<port>/metrics."""
        try:
            from ..monitoring import serve_metrics

            serve_metrics(port)
        except ImportError:
            logger.warning("compass: --compass-metrics-port needs prometheus_client "
                           "(pip install 'compass-celery[metrics]'); no metrics served")
            return
        except OSError as exc:
            logger.warning("compass: cannot serve metrics on port %d: %s", port, exc)
            return
        logger.info("compass: worker %s serves Prometheus metrics on port %d", self.name, port)

    def publish(self, if_changed: bool = False) -> bool:
        """Publish this worker's record and cache counters; False while the store is down.
        ``if_changed``: only a changed record, or the beat when its interval is up."""
        c, view = self.cache, self.view()
        if if_changed and view == self._published and not self._state_down and \
                time.monotonic() - self._last_publish_ok < self.cfg["state_refresh_s"]:
            return True
        try:
            self.compass.store.publish(view, pid=os.getpid(), hits=c.hits,
                                       misses=c.misses, loads=c.loads, evictions=c.evictions)
        except StateUnavailable as exc:
            if not self._state_down:
                logger.warning("compass: cannot publish worker state: %s", exc)
            self._state_down = True
            self._publish_ok_since = None
            return False
        if self._state_down:
            logger.warning("compass: state store back; worker %s re-published", self.name)
            self._state_down = False
        self._last_publish_ok, self._published = time.monotonic(), view
        if self._publish_ok_since is None:
            self._publish_ok_since = self._last_publish_ok
        return True

    def stats(self) -> dict[str, Any]:
        """This worker's compass state, for ``inspect stats`` and Flower."""
        c = self.cache
        with self._lock:
            running = len(self._running)
        return {"queue": self.queue, "device": c.device,
                "gpu_total_mb": round(c.total_mb, 1), "gpu_free_mb": round(c.free_mb, 1),
                "resident_models": sorted(c.resident()),
                "host_models": sorted(c.host_resident()),
                "backlog_ms": round(self.queued_backlog_ms(), 1), "running": running,
                "cache": {"hits": c.hits, "misses": c.misses, "loads": c.loads,
                          "evictions": c.evictions}}

    def may_judge_peers(self) -> bool:
        """Only a worker that has reached Redis without a break for a whole heartbeat
        timeout judges others: after an outage, live peers re-publish first."""
        timeout = self.cfg["heartbeat_timeout_s"]
        now = time.monotonic()
        return (self._publish_ok_since is not None
                and now - self._publish_ok_since >= timeout
                and now - self._last_publish_ok < timeout / 2)

    def _publish_loop(self) -> None:
        while not self._stopping.is_set():
            woken = self._wake.wait(self.cfg["state_refresh_s"])  # by a task's end, a load
            self._wake.clear()
            if not self._stopping.is_set():
                self.publish(if_changed=woken)
                self.rank.maybe_refresh()

    def _cluster(self) -> ClusterView | None:
        """The planner's view of the cluster (with demand), for the cache's rank. Read from
        the store, not through the reader: a snapshot taken here every few seconds would
        otherwise be the one a retry or a successor is placed on, up to its TTL later."""
        try:
            snapshot = self.compass.store.snapshot(time.time(), self.cfg["heartbeat_timeout_s"])
            return cluster_view(snapshot, self.compass.model_sizes())
        except (StateUnavailable, RedisError):
            return None

    def _reconcile_loop(self) -> None:
        while not self._stopping.wait(self.cfg["reconcile_s"]):
            try:
                self._reconcile()
            except (StateUnavailable, RedisError, OSError):
                continue  # Redis away: the publisher says so once
            except Exception:  # never let bookkeeping kill the worker
                logger.exception("compass: backlog reconciliation failed")

    def _reconcile(self) -> None:
        """Set the backlog from what runs and waits here. A broker that cannot be peeked
        (AMQP) leaves the charges as they are while its queue holds messages."""
        queues = self.compass.queues
        if queues is not None and not queues.peekable and queues.waiting(self.queue):
            return
        self.compass.store.set_backlog(self.name, self.queued_backlog_ms())

    def _watchdog_loop(self) -> None:
        interval = max(0.2, self.cfg["heartbeat_timeout_s"] / 3)
        while not self._stopping.wait(interval):
            if not self.may_judge_peers():
                continue  # we could not reach Redis lately either: peers may be fine
            try:
                recover(self.compass, self.name, interval)
            except (StateUnavailable, RedisError):
                continue  # Redis away: the publisher logs it once
            except Exception:  # never let recovery kill the worker
                logger.exception("compass: dead-worker recovery failed")

    # -- messages this worker cannot run: kept, never dropped ---------------------------
    def _dead_letter(self, raw: Any, why: str, queue: str | None = None) -> None:
        queues = self.compass.queues
        where = queue or f"a queue of {self.name}"
        try:
            if queues is not None:
                queues.dead_letter_raw(where, raw, why)
            logger.error("compass: %s: a message is unusable (%s); kept in %s: %.120r",
                         where, why, queues.dead_letter_key if queues else "the log", raw)
        except (RedisError, OSError) as exc:
            logger.error("compass: %s: unusable message (%s) could not be dead-lettered "
                         "(%s): %.2000r", where, why, exc, raw)

    def _on_rejected(self, sender: Any = None, message: Any = None, **kw: Any) -> None:
        if message is not None:
            queue = (getattr(message, "delivery_info", None) or {}).get("routing_key")
            self._dead_letter(getattr(message, "body", b""), "not a Celery task message",
                              queue)

    def _on_unknown(self, sender: Any = None, name: str | None = None, message: Any = None,
                    **kw: Any) -> None:
        if message is not None:
            queue = (getattr(message, "delivery_info", None) or {}).get("routing_key")
            raw = json.dumps({"headers": getattr(message, "headers", {}),
                              "body": getattr(message, "body", b"").decode("utf-8", "replace")
                              if isinstance(getattr(message, "body", b""), bytes) else "",
                              "properties": getattr(message, "properties", {})})
            self._dead_letter(raw, f"task {name!r} is not registered on {self.name}", queue)

    def _lease_loop(self) -> None:
        """Renew the leases of received, unfinished messages until the process exits."""
        queues = self.compass.queues
        if queues is None:
            return
        interval = max(0.05, lease_timeout_s(self.compass) / 3)
        while not self._exited.wait(interval):
            with self._lock:
                tags = dict(self._tags)
            if not tags:
                if self._stopping.is_set():
                    return  # stopped and nothing left in flight
                continue
            try:
                gone = set(queues.renew_leases(tags.values(), time.time()))
            except (RedisError, OSError):
                continue  # Redis away: the lease lapses, as it should for a cut worker
            if gone:
                with self._lock:
                    for task_id, tag in tags.items():
                        if tag in gone and self._tags.get(task_id) == tag:
                            del self._tags[task_id]

    # -- queue inspection ---------------------------------------------------------------
    def queued_decisions(self, limit: int = -1) -> list[Decision]:
        """Decisions of messages waiting in this worker's own queue, next first."""
        client, queues = self.compass.store.client, self.compass.queues
        if client is None or (queues is not None and not queues.peekable):
            return []
        if queues is not None:  # the broker's Redis: the state may live elsewhere (a cluster)
            return decisions_of(queues.peek(self.queue, limit))
        return peek_queue(client, self.queue, limit)

    def queued_backlog_ms(self) -> float:
        """Estimated ms charged to this worker: its running and queued tasks."""
        with self._lock:
            running = sum(d.charge_ms for d, _, _ in self._running.values()
                          if d is not None and d.worker == self.name)
        return running + sum(d.charge_ms for d in self.queued_decisions()
                             if d.worker == self.name)

    # -- Celery signals: this runtime's own hooks, connected while it runs -------------
    def _hooks(self) -> list[tuple[Any, Any]]:
        hooks = [(signals.task_received, self._on_received),
                 (signals.task_prerun, self._on_prerun),
                 (signals.task_postrun, self._on_postrun),
                 (signals.task_revoked, self._on_revoked)]
        if self.compass.queues is not None:
            hooks += [(signals.task_rejected, self._on_rejected),
                      (signals.task_unknown, self._on_unknown)]
        return hooks

    def _connect_signals(self) -> None:
        if self.compass.queues is not None:
            self.compass.queues.guard_consumer(self._dead_letter)
        for signal, handler in self._hooks():
            signal.connect(handler, weak=False)

    def _disconnect_signals(self) -> None:
        for signal, handler in self._hooks():
            signal.disconnect(handler)

    def _on_cache_event(self, kind: str, fields: dict) -> None:
        from .. import signals

        sig = {"model_loaded": signals.model_loaded, "model_evicted": signals.model_evicted}
        if kind in sig:
            sig[kind].send(sender=self.name, **fields)


def peek_queue(client: Any, queue: str, limit: int = -1) -> list[Decision]:
    """Compass decisions of the next ``limit`` messages (all when -1), next first."""
    return decisions_of(peek(client, RedisLayout(), queue, limit))


def decisions_of(messages: list[bytes]) -> list[Decision]:
    """The compass decisions carried by raw queue messages, in their order."""
    found = (Decision.from_header(message_headers(item).get("compass")) for item in messages)
    return [d for d in found if d is not None]


def _default_device() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return "cuda" if torch.cuda.is_available() else "cpu"
