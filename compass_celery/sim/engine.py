"""A minimal discrete-event loop: a heap of timed callbacks and a clock.

Events at the same time run in the order they were scheduled (a sequence number
breaks ties), so a simulation is deterministic for a fixed seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Engine:
    """``at(t, fn, *args)`` schedules; ``run()`` pops events in time order until none are left."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0

    def at(self, time_ms: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at ``time_ms`` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(time_ms, self.now), self._seq, fn, args))

    def after(self, delay_ms: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` ``delay_ms`` from now."""
        self.at(self.now + delay_ms, fn, *args)

    def run(self, until_ms: float = float("inf")) -> float:
        """Process events up to ``until_ms``; returns the clock at the end."""
        heap = self._heap
        while heap and heap[0][0] <= until_ms:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
        return self.now

    def __len__(self) -> int:
        return len(self._heap)
