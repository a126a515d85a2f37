"""Leases on the messages this worker runs: held from receipt until the task ends.

A broker that does not hand unacked messages back on its own (kombu's Redis
transport does so only after its visibility timeout) needs them renewed while they
run, so that recovery takes back only the work of a worker that stopped renewing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from redis import RedisError

from .recovery import lease_timeout_s

if TYPE_CHECKING:
    from ..broker.kombu_redis import BrokerQueues
    from ..context import CompassContext

#: Ended tasks' tags kept for deletion at most (a worker runs far fewer between rounds).
ENDED_CAP = 10_000


class Leases:
    """Delivery tags of received, unfinished messages, renewed until the process exits."""

    def __init__(self, compass: CompassContext, stopping: threading.Event) -> None:
        self.compass, self._stopping = compass, stopping
        self._lock = threading.Lock()
        self._tags: dict[str, str] = {}  # task id -> delivery tag
        # tags of ended tasks whose lease entries the loop deletes after its next renewal
        # (capped: what a long outage leaves, the recovery leader's prune takes)
        self._ended: deque[str] = deque(maxlen=ENDED_CAP)
        self.exited = threading.Event()  # set by tests that tear a runtime down

    def hold(self, task_id: str, tag: str) -> None:
        """Lease ``tag`` from now until ``release(task_id)``."""
        with self._lock:
            self._tags[task_id] = tag

    def release(self, task_id: str) -> None:
        """The task has ended: its message is acked (or handed back) from here, and its
        lease entry is deleted by the loop, so none outlives its task."""
        with self._lock:
            tag = self._tags.pop(task_id, None)
            if tag is not None:
                self._ended.append(tag)

    def _take_ended(self) -> list[str]:
        with self._lock:
            ended = list(self._ended)
            self._ended.clear()
            return ended

    def held(self) -> dict[str, str]:
        """Task id -> delivery tag of every message leased now."""
        with self._lock:
            return dict(self._tags)

    def loop(self) -> None:
        """Renew the leases of received, unfinished messages until the process exits."""
        queues = self.compass.queues
        if queues is None:
            return
        interval = max(0.05, lease_timeout_s(self.compass) / 3)
        while not self.exited.wait(interval):
            tags = self.held()
            try:
                gone = set(queues.renew_leases(tags.values(), time.time()))
            except (RedisError, OSError):
                continue  # Redis away: the lease lapses, as it should for a cut worker
            finally:
                # after the renewal that could still hold them: this thread alone renews
                self._drop_ended(queues)
            if gone:
                with self._lock:
                    for task_id, tag in tags.items():
                        if tag in gone and self._tags.get(task_id) == tag:
                            del self._tags[task_id]
            if not tags and self._stopping.is_set():
                return  # stopped and nothing left in flight

    def _drop_ended(self, queues: BrokerQueues) -> None:
        """Delete ended tasks' lease entries (kept for the next round if Redis is away)."""
        ended = self._take_ended()
        if not ended:
            return
        try:
            queues.drop_leases(ended)
        except (RedisError, OSError):
            with self._lock:
                self._ended.extendleft(reversed(ended))
