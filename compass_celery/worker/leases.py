"""Leases on the messages this worker runs: held from receipt until the task ends.

A broker that does not hand unacked messages back on its own (kombu's Redis
transport does so only after its visibility timeout) needs them renewed while they
run, so that recovery takes back only the work of a worker that stopped renewing.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from redis import RedisError

from .recovery import lease_timeout_s

if TYPE_CHECKING:
    from ..context import CompassContext


class Leases:
    """Delivery tags of received, unfinished messages, renewed until the process exits."""

    def __init__(self, compass: CompassContext, stopping: threading.Event) -> None:
        self.compass, self._stopping = compass, stopping
        self._lock = threading.Lock()
        self._tags: dict[str, str] = {}  # task id -> delivery tag
        self.exited = threading.Event()  # set by tests that tear a runtime down

    def hold(self, task_id: str, tag: str) -> None:
        """Lease ``tag`` from now until ``release(task_id)``."""
        with self._lock:
            self._tags[task_id] = tag

    def release(self, task_id: str) -> None:
        """The task has ended: its message is acked (or handed back) from here."""
        with self._lock:
            self._tags.pop(task_id, None)

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
