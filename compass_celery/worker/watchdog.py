"""The watchdog: this worker's turn at judging dead peers and draining their queues.

It acts only while this worker's own publishes have gone through for a whole
heartbeat timeout (:meth:`RecordPublisher.may_judge_peers`): a worker cut off from
Redis does not judge others.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from redis import RedisError

from ..state.connection import StateUnavailable
from .recovery import recover

if TYPE_CHECKING:
    from ..context import CompassContext
    from .publisher import RecordPublisher

logger = logging.getLogger("compass_celery.worker")


class Watchdog:
    """Runs recovery every third of the heartbeat timeout while this worker may judge."""

    def __init__(self, compass: CompassContext, name: str, publisher: RecordPublisher,
                 heartbeat_timeout_s: float, stopping: threading.Event) -> None:
        self.compass, self.name, self.publisher = compass, name, publisher
        self.interval = max(0.2, heartbeat_timeout_s / 3)
        self._stopping = stopping

    def loop(self) -> None:
        """Until the runtime stops: judge peers, drain the dead, fail overdue jobs."""
        while not self._stopping.wait(self.interval):
            if not self.publisher.may_judge_peers():
                continue  # we could not reach Redis lately either: peers may be fine
            try:
                recover(self.compass, self.name, self.interval)
            except (StateUnavailable, RedisError):
                continue  # Redis away: the publisher logs it once
            except Exception:  # never let recovery kill the worker
                logger.exception("compass: dead-worker recovery failed")
