"""The worker runtime: one worker's compass side, from start to a clean stop.

Started and stopped by the :class:`~compass_celery.worker.bootstep.CompassWorker` bootstep.
It builds the model cache and composes the parts that each own their state: the
record publisher (``publisher``), the per-task path (``task_path``), the leases on
running messages (``leases``) and the watchdog that judges dead peers (``watchdog``).
Itself it reconciles the backlog from its queue, keeps unusable messages in the
dead-letter list and, on a clean stop (SIGTERM), leaves the cluster and hands its
queue back to the live workers (:func:`~compass_celery.worker.recovery.hand_back`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery import signals
from redis import RedisError

from ..broker.kombu_redis import RedisLayout, message_headers, peek
from ..cache import EmulatedBackend, ModelCache, TorchBackend, set_current_cache
from ..jobs.runtime import JobRuntime
from ..needs import LOAD_PROFILE
from ..placement import Decision
from ..planner.batch import batch_key
from ..planner.priority import LEVELS
from ..planner.types import ClusterView
from ..settings import with_flags
from ..state.connection import StateUnavailable
from ..state.hints import HINT, take_hint
from ..state.keys import forming_member, queued_member
from ..state.views import cluster_view
from .batch import BatchRunner, set_current_batcher
from .core import queued_by_level
from .hop import DispatchHop
from .leases import Leases
from .memory import FullCollector, freeze_startup_heap
from .overhead import HandlerCpu
from .publisher import RecordPublisher
from .recovery import hand_back, mark_alive, mark_dead, take_back
from .served import RankFollower, ServedDemand
from .task_path import TaskPath
from .threads import CpuThreads
from .watchdog import Watchdog

if TYPE_CHECKING:
    from ..context import CompassContext

logger = logging.getLogger("compass_celery.worker")
#: How soon the reconcile looks again when a task's charges were changing (s).
RECONCILE_RETRY_S = 0.05


class WorkerRuntime:
    """One worker's compass side, composed of parts that each own their state: the model
    cache, the record publisher, the task path, the leases and the watchdog."""

    def __init__(self, compass: CompassContext, name: str, queue: str,
                 overrides: Mapping[str, Any] | None = None, concurrency: int = 1) -> None:
        self.compass, self.name, self.queue = compass, name, queue
        compass.plan_on_fresh_state()  # a worker's retries are placed on what is there now
        self.cfg = with_flags(compass.settings, overrides or {})
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        served = ServedDemand(self.cfg.speed, self.cfg.time_scale)
        hop = DispatchHop(self.cfg.ewma_alpha, self.cfg.time_scale)
        cpu = HandlerCpu()  # timed by the task path, published with the counters
        self.cache = self._make_cache()
        self.threads = CpuThreads(name, self.cache.device, self.cfg.torch_threads,
                                  concurrency)
        self.publisher = RecordPublisher(compass, name, queue, self.cfg, self.cache, served,
                                         RankFollower(self.cache, self._cluster),
                                         self._stopping, hop, cpu)
        self.jobs = JobRuntime(compass, name) if compass.store.client is not None else None
        self.leases = Leases(compass, self._stopping)
        self.tasks = TaskPath(compass, name, self.cfg, self.cache, served, self.jobs,
                              self.leases, self.queued_decisions, self.publisher.wake,
                              self._stopping, hop, cpu)
        self.publisher.running = self.tasks.spans
        self.batches = BatchRunner(compass, queue, self.cfg, self.tasks, self.jobs, self.leases)
        # batch keys whose count of waiting inputs a reconcile sets (to 0 when none wait):
        # every batched task's, so a restarted worker clears what its last life left
        self._batch_keys = {batch_key(t.name, getattr(t, "compass_model", None))
                            for t in compass.app.tasks.values()
                            if getattr(t, "compass_batch", None) is not None}
        self.watchdog = Watchdog(compass, name, self.publisher,
                                 self.cfg.heartbeat_timeout_s, self._stopping)

    # -- construction -----------------------------------------------------------
    def _make_cache(self) -> ModelCache:
        cfg, sizes = self.cfg, self.compass.model_sizes()
        if cfg.emulate_gpu_mb:
            backend: Any = EmulatedBackend(cfg.emulate_gpu_mb, cfg.load_mb_per_s,
                                           cfg.host_load_mb_per_s, cfg.time_scale,
                                           host_capacity_mb=cfg.emulate_host_mb,
                                           speed=cfg.speed)
        elif (device := cfg.gpu or _default_device()) is None:
            logger.warning("compass: torch is not installed; worker %s can only run tasks "
                           "that need no model (pip install 'compass-celery[torch]')", self.name)
            backend = EmulatedBackend(1.0, time_scale=0.0, device="cpu-no-torch")
        else:
            backend = TorchBackend(device, capacity_mb=cfg.device_mb)
            if not device.startswith("cuda"):
                logger.warning("compass: worker %s has no GPU; running models on cpu",
                               self.name)
        return ModelCache(backend, policy=cfg.cache_policy, lookahead=cfg.prefetch_depth,
                          sizes=sizes, on_change=self._changed,
                          on_event=self._on_cache_event)

    def _changed(self) -> None:
        """A load or an eviction: publish the record now."""
        self.publisher.wake.set()

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Preload, publish, take back what a previous run left in flight, start the loops."""
        set_current_cache(self.cache)
        set_current_batcher(self.batches)
        if self.cfg.metrics_port:  # first, so the preload's model loads are counted
            self._serve_metrics(int(self.cfg.metrics_port))
        self._say_what_cannot_load()
        self.threads.apply()  # in the thread that runs the preload (and, solo, the tasks)
        if float(self.cfg.gc_interval_s) > 0:  # compass manages collections (memory.py)
            frozen = freeze_startup_heap()  # before the preload: models stay collectable
            if frozen:
                logger.debug("compass: %d start-up objects out of the collector's walk",
                             frozen)
        preload = self._preload()
        if preload:
            self.cache.preload(preload)
        self.publisher.publish()
        try:
            self._reconcile()
        except (StateUnavailable, RedisError, OSError) as exc:
            logger.warning("compass: %s", exc)
        if self.jobs is not None:
            self._take_back()
        self._connect_signals()
        collector = FullCollector(float(self.cfg.gc_interval_s), self.tasks.running,
                                  self._stopping)
        loops = [(self.publisher.loop, "publisher"), (self._reconcile_loop, "reconciler"),
                 (self.tasks.prefetch_loop, "prefetch"), (collector.loop, "gc")]
        queues = self.compass.queues
        if self.jobs is not None:  # Redis-backed: watch for dead peers, lease what runs
            loops.append((self.watchdog.loop, "watchdog"))
        if self.jobs is not None and queues is not None and not queues.returns_unacked:
            lease = threading.Thread(target=self.leases.loop, name="compass-leases",
                                     daemon=True)
            lease.start()  # not joined at stop: leases outlive the consumer until exit
        for target, label in loops:
            t = threading.Thread(target=target, name=f"compass-{label}", daemon=True)
            t.start()
            self._threads.append(t)
        logger.info("compass: worker %s consuming %s on %s (%.0f MB)", self.name, self.queue,
                    self.cache.device, self.cache.total_mb)

    def _preload(self) -> list[str]:
        """The models to load at start: ``compass_preload``, where ``@hint`` stands for one
        preload hint an autoscaler published in Redis (:func:`state.hints.take_hint`)."""
        wanted = list(self.cfg.preload)
        if HINT not in wanted:
            return wanted
        hint: list[str] = []
        try:
            if self.compass.store.client is not None:
                hint = take_hint(self.compass.store.client, self.cfg.key_prefix)
        except (RedisError, OSError) as exc:
            logger.warning("compass: could not read a preload hint: %s", exc)
        logger.info("compass: worker %s preloads the hint %s", self.name, hint or "(none)")
        return [m for m in wanted if m != HINT] + [m for m in hint if m not in wanted]

    def _say_what_cannot_load(self) -> None:
        """Name, once at start, the declared models this worker has no loader for."""
        missing = sorted(m for m in self.compass.model_sizes() if not self.cache.loadable(m))
        if missing:
            logger.warning("compass: worker %s has no loader for %s: their tasks are placed "
                           "by size and run, but compass does not load them and get_model() "
                           "cannot return them (register a loader with "
                           "@compass_celery.model(name, size_mb=...))", self.name,
                           ", ".join(missing))

    def _take_back(self) -> None:
        """Mark this queue alive and take back what a previous run under this name left."""
        try:
            mark_alive(self.compass, self.queue)
            taken = take_back(self.compass, self.name)
            if taken:
                logger.warning("compass: took back %d task(s) a previous %s left in "
                               "flight", taken, self.name)
        except (StateUnavailable, RedisError) as exc:
            logger.warning("compass: could not take back in-flight tasks: %s", exc)

    def stop(self) -> None:
        """Runs once the consumer has stopped: leave the cluster and hand back the queue.

        The record goes first, so producers stop choosing this worker; the queue
        name joins the dead-queue set, so anything that still lands in it (a
        producer's stale snapshot, a prefetched message kombu restores when the
        connection closes) is drained by the recovery leader.
        """
        self._stopping.set()
        self.publisher.wake.set()
        self.tasks.stop()
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
        set_current_batcher(None)

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

    def stats(self) -> dict[str, Any]:
        """This worker's compass state for ``inspect stats`` and Flower's worker page: flat,
        named fields (``compass_queue``, ``compass_gpu_free_mb`` ...), one row each."""
        c, cpu_ms = self.cache, self.tasks.cpu.per_task_ms()
        return {"compass_queue": self.queue, "compass_device": c.device,
                "compass_gpu_total_mb": round(c.total_mb, 1),
                "compass_gpu_free_mb": round(c.free_mb, 1),
                "compass_resident_models": ", ".join(sorted(c.resident())),
                "compass_host_models": ", ".join(sorted(c.host_resident())),
                "compass_backlog_ms": round(self.queued_backlog_ms(), 1),
                "compass_running": self.tasks.running(),
                "compass_cache_hits": c.hits, "compass_cache_misses": c.misses,
                "compass_cache_loads": c.loads, "compass_cache_evictions": c.evictions,
                "compass_cpu_ms_per_task": None if cpu_ms is None else round(cpu_ms, 3),
                "compass_batches": ", ".join(f"{n} x{k}" for n, k in
                                             sorted(self.batches.sizes.items()))}

    def _cluster(self) -> ClusterView | None:
        """The planner's view of the cluster (with demand), for the cache's rank. Read from
        the store, not through the reader: a snapshot taken here every few seconds would
        otherwise be the one a retry or a successor is placed on, up to its TTL later."""
        try:
            snapshot = self.compass.store.snapshot(time.time(), self.cfg.heartbeat_timeout_s)
            self.threads.observe(snapshot.workers)  # CPU workers beside this one, recounted
            return cluster_view(snapshot, self.compass.model_sizes())
        except (StateUnavailable, RedisError):
            return None

    def _reconcile_loop(self) -> None:
        wait = self.cfg.reconcile_s
        while not self._stopping.wait(wait):
            wait = self.cfg.reconcile_s
            try:
                if not self._reconcile():  # a task's charges were changing: soon again
                    wait = min(RECONCILE_RETRY_S, wait)
            except (StateUnavailable, RedisError, OSError):
                continue  # Redis away: the publisher says so once
            except Exception:  # never let bookkeeping kill the worker
                logger.exception("compass: backlog reconciliation failed")

    def _reconcile(self) -> bool:
        """Age what waits here, then set the backlog (in total and queued per priority
        level) from what runs and waits, between this worker's own changes to them (else
        a task's start or end would count twice or not at all); False: one was under way,
        nothing set. A broker that cannot be peeked (AMQP) leaves the charges as they are
        while its queue holds messages."""
        queues = self.compass.queues
        if queues is not None and self.cfg.priority_age_s:
            queues.age(self.queue, time.time(), self.cfg.priority_age_s)
        if queues is not None and not queues.peekable and queues.waiting(self.queue):
            return True
        epoch = self.tasks.ledger_epoch()
        if epoch is None:
            return False
        store = self.compass.store
        waiting = [d for d in self.queued_decisions() if d.worker == self.name]
        # every level is written, so one that emptied is set back to 0
        by_level = {**dict.fromkeys(LEVELS, 0.0),
                    **queued_by_level((d.priority, d.charge_ms) for d in waiting)}
        inputs = dict.fromkeys(self._batch_keys, 0)  # keys seen before: back to 0
        for d in waiting:
            if d.batch:
                inputs[d.batch] = inputs.get(d.batch, 0) + 1
        pipe = store.client.pipeline(transaction=False) if store.client is not None else None
        backlog = self.tasks.running_charge_ms() + sum(d.charge_ms for d in waiting)
        store.count([("backlog", self.name, backlog, "set"),  # a "set" never goes below 0
                     *(("queued", queued_member(self.name, level), ms, "set")
                       for level, ms in by_level.items()),
                     *(("forming", forming_member(self.name, batch), n, "set")
                       for batch, n in inputs.items())], pipe=pipe)
        self._batch_keys |= inputs.keys()  # once seen, always set: a stale count is reset
        if pipe is None:
            return True
        return self.tasks.write_if_settled(epoch, lambda: store.execute(pipe))

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
        return self.tasks.running_charge_ms() + sum(
            d.charge_ms for d in self.queued_decisions() if d.worker == self.name)

    # -- Celery signals: this runtime's own hooks, connected while it runs -------------
    def _hooks(self) -> list[tuple[Any, Any]]:
        t = self.tasks
        hooks = [(signals.task_received, t.on_received), (signals.task_prerun, t.on_prerun),
                 (signals.task_prerun, self.threads.apply),
                 (signals.task_postrun, t.on_postrun), (signals.task_revoked, t.on_revoked)]
        if self.compass.queues is not None:
            hooks += [(signals.task_rejected, self._on_rejected),
                      (signals.task_unknown, self._on_unknown)]
        return hooks

    def _connect_signals(self) -> None:
        if self.compass.queues is not None:
            self.compass.queues.guard_consumer(self._dead_letter)
            if self.cfg.atomic_fetch:  # before the consumer starts
                self.compass.queues.fetch_atomically(self.queue)
                self._read_job_states()
                if self.cfg.hold_max_ms > 0 and self._state_on_broker():
                    self.compass.queues.hold_slot(
                        self.queue, self.name, self.cfg.hold_max_ms * self.cfg.time_scale)
                elif self.cfg.hold_max_ms > 0:
                    logger.warning("compass: compass_hold_max_ms is set but the state Redis "
                                   "is not the broker's; worker %s does not hold its slot",
                                   self.name)
        for signal, handler in self._hooks():
            signal.connect(handler, weak=False)

    def _read_job_states(self) -> None:
        """Where the job records live in the broker's Redis (a Redis broker, no state
        Redis apart), the atomic fetch reads a job node's job state as it takes the node:
        the receipt check that drops a node of an ended job asks Redis nothing."""
        from ..broker.fetch import read_job_states
        from ..state import keys

        on_broker = self.jobs is not None and self._state_on_broker()
        read_job_states(self.queue, keys.JOB_HEADER if on_broker else "",
                        keys.key(keys.JOB, self.cfg.key_prefix, id="\0"))

    def _state_on_broker(self) -> bool:
        """Whether the state (job records, pending-queued counts) lives in the broker's
        Redis, where the atomic fetch can read it (the held slot, the job-state check)."""
        url = self.cfg.redis_url
        return url is None or url == (self.compass.app.conf.broker_url or "")

    def _disconnect_signals(self) -> None:
        for signal, handler in self._hooks():
            signal.disconnect(handler)

    def _on_cache_event(self, kind: str, fields: dict) -> None:
        from .. import signals

        if kind == "model_loaded":
            from_host = bool(fields.get("from_host"))
            logger.info("compass: loaded model %s in %.0f ms%s", fields["model"],
                        float(fields["ms"]), " (from host memory)" if from_host else "")
            if not from_host:
                self._learn_load(fields["model"], float(fields["ms"]))
        elif kind == "model_evicted":
            logger.info("compass: evicted model %s", fields["model"])
        sig = {"model_loaded": signals.model_loaded, "model_evicted": signals.model_evicted}
        if kind in sig:
            sig[kind].send(sender=self.name, **{k: v for k, v in fields.items()
                                                if k != "from_host"})

    def _learn_load(self, model: str, real_ms: float) -> None:
        """Fold a measured load from storage into the model's learned load time, which
        placement counts instead of size over bandwidth (a real load also builds the
        module and warms it up, which no bandwidth says)."""
        try:
            self.compass.store.record_run(f"{LOAD_PROFILE}|{model}",
                                          real_ms / self.cfg.time_scale if
                                          self.cfg.time_scale else real_ms,
                                          self.cfg.ewma_alpha)
        except (StateUnavailable, RedisError, OSError) as exc:
            logger.warning("compass: load time of %s not learned: %s", model, exc)


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
