"""The narrow view of Compass that the Celery edges take: what they read, nothing more.

The router, the job runtime, recovery, the worker step and eager mode are given
a :class:`CompassContext` instead of the whole :class:`~compass_celery.app.Compass`,
so each of them can be built and tested with a small stand-in, and none of them
imports the app module (which imports them). This module imports no other module
of the package at run time; the names under ``TYPE_CHECKING`` are lower layers
that never import it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from celery import Celery

    from .broker.kombu_redis import BrokerQueues
    from .placement import Decision
    from .planner.base import Policy
    from .settings import CompassSettings
    from .state.reader import SnapshotReader
    from .state.store import StateStore


class CompassContext(Protocol):
    """What a Celery edge needs from one Compass-enabled app."""

    app: Celery

    @property
    def settings(self) -> CompassSettings:
        """The checked ``compass_*`` settings, read by attribute (``settings.time_scale``)."""

    @property
    def eager(self) -> bool:
        """Whether the app runs tasks inline (``task_always_eager``)."""

    @property
    def store(self) -> StateStore:
        """Where worker records, backlogs and profiles live."""

    @property
    def reader(self) -> SnapshotReader:
        """This process's cached view of the store."""

    @property
    def policy(self) -> Policy:
        """The placement policy."""

    @property
    def shared_queue(self) -> str:
        """The fallback queue every worker consumes."""

    @property
    def queues(self) -> BrokerQueues | None:
        """The broker's compass queues, Redis or AMQP (None when eager)."""

    def plan_on_fresh_state(self) -> None:
        """Make this process's decisions read before deciding (a worker's)."""

    def follow_mode(self, eager: bool | None = None) -> None:
        """Switch the store if ``task_always_eager`` changed since it was made."""

    @property
    def amqp_broker(self) -> bool:
        """Whether the broker is RabbitMQ (AMQP)."""

    def priority_queues(self) -> None:
        """Declare compass's queues as priority queues where the broker needs it."""

    def destination(self, queue: str) -> Any:
        """``queue`` as Celery takes it (a declaration where it would not create one)."""

    def queue_for(self, worker_name: str) -> str:
        """The name of ``worker_name``'s own queue."""

    def model_sizes(self) -> dict[str, float]:
        """Every known model's size in MB."""

    def remember(self, task_id: str, decision: Decision) -> None:
        """Keep ``decision`` for ``placement(task_id)`` in this process."""
