"""The worker bootstep: own queue and shared queue, and a runtime between start and stop.

``CompassWorker`` is added to ``app.steps['worker']`` by ``Compass(app)``; it
selects the worker's own queue and the shared queue at build time and runs a
:class:`~compass_celery.worker.runtime.WorkerRuntime` between start and stop.
Test workers call ``terminate`` instead of ``stop``; both tear down alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
from celery import Celery, bootsteps

from ..broker.amqp import is_amqp
from ..planner.types import SHARED
from ..settings import with_flags
from .runtime import WorkerRuntime, peek_queue

if TYPE_CHECKING:
    from ..context import CompassContext

#: How often an AMQP worker's event loop wakes at least (seconds).
AMQP_WAKE_S = 0.02

# Worker command-line flags, each overriding the compass_* setting of the same name.
WORKER_FLAGS: Mapping[str, tuple[type | click.ParamType, str]] = {
    "gpu": (str, "device to run models on: cuda, cuda:N or cpu"),
    "device_mb": (float, "memory models may take on the torch device, MB"),
    "emulate_gpu_mb": (float, "emulate a GPU of this many MB instead of using torch"),
    "emulate_host_mb": (float, "host-RAM tier of the emulated GPU, MB (default none)"),
    "load_mb_per_s": (float, "model load bandwidth of the (emulated) GPU, MB/s"),
    "speed": (float, "speed factor of this worker's GPU"),
    "preload": (str, "comma-separated models to load at start"),
    "torch_threads": (int, "torch threads on a cpu device (default: this worker's share of "
                           "the host's cores)"),
    "time_scale": (float, "real seconds per workload second for emulated sleeps"),
    "metrics_port": (int, "serve Prometheus metrics on this port (/metrics)"),
}


def install_worker_steps(app: Celery) -> None:
    """Add the worker flags and the bootstep (idempotent)."""
    if CompassWorker in app.steps["worker"]:
        return
    for key, (typ, doc) in WORKER_FLAGS.items():
        flag = "--compass-" + key.replace("_", "-")
        app.user_options["worker"].add(click.Option([flag], type=typ, default=None, help=doc))
    app.steps["worker"].add(CompassWorker)


class CompassWorker(bootsteps.StartStopStep):
    """Consume this worker's own queue and the shared one; run the runtime."""

    label = "Compass"

    def __init__(self, worker: Any, **options: Any) -> None:
        self.runtime: WorkerRuntime | None = None
        compass = getattr(worker.app, "compass", None)
        self.enabled = compass is not None
        if not self.enabled:
            return
        if _is_solo(worker.pool_cls) and worker.concurrency != 1:
            # The solo pool runs one task at a time, but Celery sizes the prefetch by
            # concurrency (the CPU count by default): the worker would hold tasks it
            # cannot start while a peer sits idle, and a stop would hand back less.
            worker.concurrency = 1
        self.overrides = {k: options.get(f"compass_{k}") for k in WORKER_FLAGS
                          if options.get(f"compass_{k}") is not None}
        with_flags(compass.settings, self.overrides)  # a bad flag stops the start here
        compass.priority_queues()  # before the queues below are named (RabbitMQ)
        queues = worker.app.amqp.queues
        self.own_queue = compass.queue_for(worker.hostname)
        for name in (self.own_queue, compass.shared_queue):
            # over RabbitMQ, the declaration compass's queue table makes (a priority queue)
            queues.select_add(queues[name] if compass.amqp_broker else name)

    def start(self, worker: Any) -> None:
        """Build and start this worker's runtime (the consumer starts after)."""
        hub = getattr(worker, "hub", None)
        if hub is not None and is_amqp(worker.app.conf.broker_url):
            # py-amqp can read a delivery's frames into its buffer without the socket
            # becoming readable again; the event loop then handles them only when its
            # next timer fires, up to 10 s later. A short timer bounds that wait.
            hub.call_repeatedly(AMQP_WAKE_S, _wake)
        compass: CompassContext = worker.app.compass
        self.runtime = WorkerRuntime(compass, worker.hostname, self.own_queue, self.overrides,
                                     concurrency=worker.concurrency or 1)
        self.runtime.start()

    def stop(self, worker: Any) -> None:
        """Stop the runtime once the consumer has stopped: leave and hand back the queue."""
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None

    terminate = shutdown = stop

    def info(self, worker: Any) -> dict[str, Any]:
        """What ``celery inspect stats`` (and Flower's worker page) shows: compass_* fields."""
        return self.runtime.stats() if self.runtime is not None else {}


def _wake() -> None:
    """A no-op timer tick: its only job is to end the event loop's poll."""


def _is_solo(pool_cls: Any) -> bool:
    """Whether the worker runs the solo pool (one task at a time, in the main process)."""
    from celery.concurrency.solo import TaskPool as SoloPool

    return isinstance(pool_cls, type) and issubclass(pool_cls, SoloPool)


__all__ = ["SHARED", "WORKER_FLAGS", "CompassWorker", "WorkerRuntime", "install_worker_steps",
           "peek_queue"]
