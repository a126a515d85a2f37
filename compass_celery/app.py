"""``Compass(app)``: installs routing, worker steps and signal hooks on a Celery app.

Glue only: decisions live in :mod:`compass_celery.placement` and the planner,
state in :mod:`compass_celery.state`, worker behaviour in :mod:`compass_celery.worker`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from functools import cached_property, partial
from typing import Any

from celery import Celery, signals
from kombu.utils.imports import symbol_by_name

from . import settings as settings_mod
from . import tracing
from .admission import earliest_expiry
from .broker.kombu_redis import BrokerQueues, RedisLayout, RedisQueues
from .placement import Decision
from .planner import get_policy
from .planner.base import Policy
from .planner.priority import broker_priority
from .router import CompassRouter
from .state.connection import connect
from .state.keys import JOB_HEADER
from .state.reader import SnapshotReader
from .state.store import FULL_READ_S, MemoryStateStore, RedisStateStore, StateStore
from .state.views import cluster_view, with_planned_loads
from .task_class import install_task_class, refuse_bound_tasks

logger = logging.getLogger("compass_celery")

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://", "sentinel://")
MAX_DECISIONS = 10_000

class CompassControl:
    """Mixed into the app's ``Control`` by ``Compass(app)``: ``purge()`` discards the tasks
    waiting in compass's queues too, which Celery's configured queues never name (each
    worker's own queue carries its hostname)."""

    app: Celery

    def purge(self, connection: Any = None) -> int:
        """Discard every waiting task, in Celery's queues and compass's; how many."""
        count = super().purge(connection)  # type: ignore[misc]
        compass = getattr(self.app, "compass", None)
        return count + (compass.purge(connection) if compass is not None else 0)

    discard_all = purge


def install_control(app: Celery) -> None:
    """Make ``app.control`` a :class:`CompassControl` (idempotent); one made already is
    made anew on its next use."""
    base = symbol_by_name(app.control_cls)
    if issubclass(base, CompassControl):
        return
    app.control_cls = type(base.__name__, (CompassControl, base),
                           {"__module__": base.__module__})
    app.__dict__.pop("control", None)


class Compass:
    """Compass scheduling for one Celery app. ``Compass(app)`` is all a user writes."""

    def __init__(self, app: Celery, *, store: StateStore | None = None) -> None:
        refuse_bound_tasks(app)
        self.app = app
        self._store = store
        self._own_store = store is None  # made here, for the mode (eager or not) in force
        self._store_eager: bool | None = None
        self._destinations: dict[str, Any] = {}  # queue name -> what Celery is handed
        self._reads_ahead = True  # a worker's runtime turns it off (it reads before deciding)
        # (Celery's producer pool, whether its broker is AMQP): see _publishes_amqp
        self._pool_amqp: tuple[Any, bool] = (None, False)
        self.router = CompassRouter(self)
        self.decisions: OrderedDict[str, Decision] = OrderedDict()
        app.compass = self  # type: ignore[attr-defined]
        # Every (re)load of the configuration fires this, including a config_from_object
        # after Compass(app) on an app that was already configured.
        app.on_after_configure.connect(self._on_configure, weak=False)
        if app.configured:
            self._on_configure()
        from .worker.bootstep import install_worker_steps

        install_worker_steps(app)
        install_task_class(app)
        install_control(app)
        self._connect_signals()

    # -- settings and collaborators ------------------------------------------------
    def _on_configure(self, *args: Any, **kwargs: Any) -> None:
        """Fill the Celery settings the app left unset; keep (and report) the rest.

        Runs on every configuration load, so a ``config_from_object`` after
        ``Compass(app)`` is decided afresh; what to write is decided in settings.py.
        """
        conf = self.app.conf
        settings_mod.refuse_pickle(conf)  # refused here, once, before anything is logged
        # the trace directory is read once, off the task path: again here, for a config
        # module that sets COMPASS_TRACE_DIR after compass was imported
        tracing.configure()
        to_apply, differences = settings_mod.recommend(conf)
        for key, value in to_apply.items():
            conf[key] = value
        for difference in differences:
            logger.warning("%s", difference.message())
        self.__dict__.pop("settings", None)  # compass_* values may have been (re)loaded
        self._destinations = {}  # task_queues / task_create_missing_queues may have changed
        routes = conf.get("task_routes")
        routes = list(routes) if isinstance(routes, (list, tuple)) else (
            [routes] if routes else [])
        if self.router not in routes:
            conf.task_routes = [self.router, *routes]

    @cached_property
    def settings(self) -> settings_mod.CompassSettings:
        """The checked ``compass_*`` settings (read by attribute: ``settings.time_scale``),
        after refusing pickle anywhere in the app."""
        from .broker.amqp import is_amqp

        conf = self.app.conf
        settings_mod.refuse_pickle(conf)
        # a RabbitMQ worker cannot take waiting messages by content: it runs each input
        # alone, so there is never a batch to join and each input costs a full run
        fixed = {"batch_aware": False} if is_amqp(conf.broker_url) else {}
        out = settings_mod.resolve(conf, **fixed)
        if (conf.broker_url or "").startswith(REDIS_SCHEMES):
            from .broker.fetch import ring_compass_queues

            # every push onto a compass queue wakes its idle consumer (the atomic fetch)
            ring_compass_queues(out.queue_prefix, out.shared_queue)
        return out

    @property
    def eager(self) -> bool:
        """True when tasks run inline (``task_always_eager``); state then stays in memory."""
        return bool(self.app.conf.task_always_eager)

    @property
    def redis_url(self) -> str | None:
        """The state Redis: ``compass_redis_url``, else a Redis broker URL, else None."""
        url = self.settings.redis_url
        if url:
            return url
        broker = self.app.conf.broker_url or ""
        return broker if broker.startswith(REDIS_SCHEMES) else None

    @property
    def store(self) -> StateStore:
        """The state store, made on first use: Redis (Sentinel-aware) with a URL, else in memory
        (eager). :meth:`follow_mode` makes it anew when ``task_always_eager`` was switched."""
        if self._store is None:
            self._store_eager = self.eager
            url = None if self.eager else self.redis_url
            options = self.app.conf.broker_transport_options or {}
            master = self.settings.sentinel_master or options.get("master_name")
            self._store = (RedisStateStore(url, self.settings.key_prefix,
                                           partial(connect, master_name=master,
                                                   sentinel_kwargs=options.get(
                                                       "sentinel_kwargs")),
                                           queue_prefix=self.settings.queue_prefix,
                                           beat_sync_s=FULL_READ_S) if url
                           else MemoryStateStore())
        return self._store

    @cached_property
    def queues(self) -> BrokerQueues | None:
        """Compass queues in the broker (hand-back, recovery, leases): Redis lists, or
        RabbitMQ queues with the move marks in the state Redis; None when eager, when
        the broker is neither, or when an AMQP broker has no state Redis."""
        broker = self.app.conf.broker_url or ""
        if self.eager:
            return None
        from .broker.amqp import AmqpQueues, is_amqp

        if is_amqp(broker):
            client = self.store.client
            return None if client is None else AmqpQueues(self.app, client,
                                                         self.settings.key_prefix)
        if not broker.startswith(REDIS_SCHEMES):
            return None
        options = self.app.conf.broker_transport_options or {}
        client = connect(broker, master_name=options.get("master_name"),
                         sentinel_kwargs=options.get("sentinel_kwargs"))
        return RedisQueues(client, RedisLayout.from_options(options),
                           self.settings.key_prefix)

    @cached_property
    def reader(self) -> SnapshotReader:
        """Snapshots for routing, reused for ``compass_snapshot_ttl_s``, read ahead for
        ``compass_snapshot_refresh_ahead_s`` past it and kept fresh for
        ``compass_snapshot_keep_fresh_s`` after a decision (Redis only: in-process reads
        are cheap), plus local charges."""
        ahead = self.store.client is not None and self._reads_ahead
        reader = SnapshotReader(
            self.store, self.settings.snapshot_ttl_s, self.settings.heartbeat_timeout_s,
            refresh_ahead_s=self.settings.snapshot_refresh_ahead_s if ahead else 0.0,
            keep_fresh_s=self.settings.snapshot_keep_fresh_s if ahead else 0.0)
        # every producer's planned loads, in what each read plans on (workers' too)
        reader.fold = lambda snap: with_planned_loads(snap, self.model_sizes())
        if ahead:  # a producer's decisions plan on the view; a worker's rarely need one
            reader.prepare = lambda snap: cluster_view(snap, self.model_sizes())
        return reader

    def plan_on_fresh_state(self) -> None:
        """This process is a worker: its re-placements read before deciding, never ahead
        (its reader, made now or later, neither reads ahead nor keeps fresh)."""
        self._reads_ahead = False
        if "reader" in self.__dict__:  # made already (cached_property keeps it there)
            self.reader.read_before_deciding()

    @cached_property
    def policy(self) -> Policy:
        """The placement policy named by ``compass_policy``, seeded with ``compass_seed``."""
        return get_policy(self.settings.policy, seed=self.settings.seed)

    @property
    def shared_queue(self) -> str:
        """The fallback queue every Compass worker consumes."""
        return self.settings.shared_queue

    def follow_mode(self, eager: bool | None = None) -> None:
        """Make the store (with this process's reader and queues) anew if it was made for the
        other mode, so eager tests and Redis-backed ones can share a process. Called where a
        task or a job is sent or a worker declared; ``eager`` when the caller knows it (a
        router runs only when not eager), else ``task_always_eager`` is read."""
        eager = self.eager if eager is None else eager
        if self._own_store and self._store is not None and self._store_eager != eager:
            self._store = None
            for made in ("reader", "queues"):
                self.__dict__.pop(made, None)

    @property
    def amqp_broker(self) -> bool:
        """Whether the broker is RabbitMQ (AMQP), where priorities live in the queue."""
        from .broker.amqp import is_amqp

        return is_amqp(self.app.conf.broker_url)

    def _publishes_amqp(self) -> bool:
        """:attr:`amqp_broker` for a message being published: decided once per Celery
        producer pool (the hot path: Celery's ``broker_url`` is an environment lookup and
        a chain of maps, ~6 us). The pool was made from ``broker_url`` when first used
        and publishes there until it is replaced (after a fork), whatever the setting
        says later; a new pool is judged afresh."""
        pool = self.app.pool
        known, amqp = self._pool_amqp
        if known is not pool:
            amqp = self.amqp_broker
            self._pool_amqp = (pool, amqp)
        return amqp

    def priority_queues(self) -> None:
        """On RabbitMQ, declare every compass queue (own and shared) as a priority queue
        (``x-max-priority``), wherever it is first named: producer, worker or drain."""
        if self.amqp_broker:
            from .broker.amqp import declare_with_priority

            declare_with_priority(self.app.amqp.queues, self.settings.queue_prefix,
                                  self.shared_queue)

    def destination(self, queue: str) -> Any:
        """What to hand Celery as ``queue=``: the name, or, where Celery would refuse a queue
        it does not list (``task_create_missing_queues=False``), its full declaration. A
        worker's queue cannot be listed ahead: its name carries the worker's hostname.
        Decided once per queue (the hot path: two setting reads cost more than a decision)."""
        known = self._destinations.get(queue)
        if known is None:
            self.priority_queues()
            queues = self.app.amqp.queues
            known = queue if queue in queues or self.app.conf.task_create_missing_queues \
                else queues.new_missing(queue)
            self._destinations[queue] = known
        return known

    def queue_for(self, worker_name: str) -> str:
        """The name of ``worker_name``'s own queue (``compass_queue_prefix`` + name)."""
        return f"{self.settings.queue_prefix}{worker_name}"

    def task_queues(self) -> list[str]:
        """Every compass queue a task may wait in: each worker's own (live, or dead and not
        drained yet) and the shared one; none of them is among Celery's configured queues."""
        self.follow_mode()
        snap = self.store.snapshot(time.time(), self.settings.heartbeat_timeout_s)
        return sorted({w.queue for w in snap.workers} | {queue for _, queue in snap.dead}
                      | {self.shared_queue})

    def purge(self, connection: Any = None) -> int:
        """Discard the tasks waiting in compass's queues (:meth:`task_queues`); how many.
        ``app.control.purge()`` calls it after purging Celery's own queues."""
        if self.eager:
            return 0
        total = 0
        with self.app.connection_or_acquire(connection) as conn:
            for queue in self.task_queues():
                # never declared (RabbitMQ): nothing waits there
                with contextlib.suppress(*conn.channel_errors):
                    total += conn.default_channel.queue_purge(queue) or 0
        return total

    def model_sizes(self) -> dict[str, float]:
        """Model sizes in MB: the registry's, overridden by ``compass_models``."""
        from .cache.registry import default_registry

        return {**default_registry.sizes_mb(), **self.settings.models}

    # -- what this process placed ---------------------------------------------------
    def placement(self, task_id: str) -> Decision | None:
        """Where a task this process sent (or ran eagerly) was placed, and why."""
        return self.decisions.get(task_id)

    def remember(self, task_id: str, decision: Decision) -> None:
        """Keep a decision for :meth:`placement`; the oldest go past ``MAX_DECISIONS``."""
        self.decisions[task_id] = decision
        while len(self.decisions) > MAX_DECISIONS:
            self.decisions.popitem(last=False)

    # -- signals ---------------------------------------------------------------------
    def _connect_signals(self) -> None:
        """The producer side's one hook, held weakly: it goes with this object (and its
        app); the worker runtime connects its own."""
        signals.before_task_publish.connect(self._before_publish)

    def close(self) -> None:
        """Release what this app's compass started in this process: the publish hook, the
        snapshot reader's and the charge batcher's threads (charges gathered are written
        first), and, as :meth:`reset` does, the eager-mode workers and the placements
        remembered. The app keeps working: a later task starts them again when it needs
        them."""
        signals.before_task_publish.disconnect(self._before_publish)
        if "reader" in self.__dict__:
            self.reader.close()
        if self.router.charges is not None:
            self.router.charges.close()
            self.router.charges = None
        self.reset()

    def reset(self) -> None:
        """Forget this process's eager-mode cluster (the workers declared with
        ``add_worker``, their backlogs and learned run times) and the placements
        :meth:`placement` remembers, so the next test starts from none. A Redis store is
        left as it is: its state is the cluster's, not this process's."""
        if self._own_store and isinstance(self._store, MemoryStateStore):
            if "reader" in self.__dict__:
                self.reader.close()
            self._store = None
            for made in ("reader", "queues"):
                self.__dict__.pop(made, None)
        self.decisions.clear()

    def _before_publish(self, sender: str | None = None, headers: dict | None = None,
                        body: Any = None, properties: dict | None = None, **kw: Any) -> None:
        from .flower import annotate_headers

        decision = self.router.take_pending(sender or "")
        if headers is None:
            return
        if properties is not None and JOB_HEADER in headers:
            # a job node's reprs, given to Celery ready-made (jobs.send), are headers only
            properties.pop("argsrepr", None)
            properties.pop("kwargsrepr", None)
        if decision is not None:
            headers["compass"] = decision.as_header()
            if headers.get("id"):
                self.remember(headers["id"], decision)
        placed = headers.get("compass")
        if isinstance(placed, dict) and placed.get("expires_at"):
            # past this, starting it cannot meet its deadline: Celery's own expiry drops
            # it unrun (a header only: an AMQP message TTL would drop it unseen)
            headers["expires"] = earliest_expiry(headers.get("expires"),
                                                 float(placed["expires_at"]))
        if properties is not None and isinstance(placed, dict) \
                and placed.get("priority") is not None:
            # one meaning on every broker: the level (9 most urgent) as this broker reads it
            properties["priority"] = broker_priority(int(placed["priority"]),
                                                     redis=not self._publishes_amqp())
        # Routed tasks and the successors workers send (their compass header is set by
        # publish_node) alike: the placement rides on argsrepr and kwargsrepr into Flower.
        args = body[0] if isinstance(body, (list, tuple)) and body else None
        annotate_headers(headers, args)
