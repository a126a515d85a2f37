"""The CPU compass's own handlers spend on each task a worker runs.

Around every task the worker leases its message, resolves its inputs, takes its
charge off the backlog, records its completion and plans and sends its successors:
work a plain Celery worker does not do, or does differently (a chain sends its next
task too). Timed here on the thread that runs them (``time.thread_time``), without
the model loads they wait for (those are the model's cost, not the scheduler's), it
answers what an operator adopting compass asks first: what does it cost per task.
Published with the worker's counters, shown by ``inspect stats``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class HandlerCpu:
    """CPU seconds spent in compass's task handlers, and the tasks they handled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.cpu_s = 0.0
        self.tasks = 0

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Count the CPU this thread spends inside, less what :meth:`excluding` set aside."""
        started = time.thread_time()
        self._local.excluded = 0.0
        try:
            yield
        finally:
            spent = time.thread_time() - started - self._local.excluded
            with self._lock:
                self.cpu_s += max(spent, 0.0)

    @contextmanager
    def excluding(self) -> Iterator[None]:
        """Leave out of the measure around it what runs inside (a model load)."""
        started = time.thread_time()
        try:
            yield
        finally:
            self._local.excluded = (getattr(self._local, "excluded", 0.0)
                                    + time.thread_time() - started)

    def task_done(self) -> None:
        """One more task handled to its end."""
        with self._lock:
            self.tasks += 1

    def totals(self) -> tuple[float, int]:
        """(CPU ms spent, tasks handled) so far."""
        with self._lock:
            return 1000.0 * self.cpu_s, self.tasks

    def per_task_ms(self) -> float | None:
        """The mean CPU ms a task cost the handlers; ``None`` before the first task."""
        ms, tasks = self.totals()
        return ms / tasks if tasks else None
