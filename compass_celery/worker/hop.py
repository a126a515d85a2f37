"""This worker's per-task dispatch, learned from the gaps between its tasks.

Between one task's end and the start of the next one already waiting, a worker settles
the first (result store, job completion, ack) and fetches and decodes the second. No
run time says so, yet every task pays it: on two shared cores it is 3 to 15 ms, a
sixth of a 20 ms forward pass. The worker measures it on the gaps that are nothing but
that (the next task was queued before the last one ended, and nothing else ran in
between), keeps an exponentially weighted mean, and publishes it with its record
(``WorkerView.hop_ms``), where the planner adds it before every task's start.
"""

from __future__ import annotations

import threading

from .timescale import workload_ms

#: The published hop follows the mean only once it moved this far (ms, or this share of
#: it, whichever is more): a record that changed on every task would be written, and
#: decoded by every producer, on every task.
STEP_MS, STEP_SHARE = 0.5, 0.1


class DispatchHop:
    """The measured gap between back-to-back tasks, in workload ms (real ms over the
    time scale, as run times are learned)."""

    def __init__(self, alpha: float, time_scale: float = 1.0) -> None:
        self.alpha = float(alpha)
        self.time_scale = float(time_scale) or 1.0
        self._lock = threading.Lock()
        self._ended: float | None = None  # when the last task's run ended (epoch s)
        self._mean: float | None = None
        self._published = 0.0
        self.samples = 0

    def ended(self, at: float) -> None:
        """A task's run ended at ``at`` (epoch s): the next gap is timed from here."""
        with self._lock:
            self._ended = at

    def started(self, at: float, queued_at: float, alone: bool) -> None:
        """A task starts at ``at`` (epoch s); it was sent at ``queued_at`` (the sender's
        clock; 0 when unknown). The gap counts only when the task was already waiting
        when the last one ended and no other task runs here (``alone``): a gap that
        began idle is the sender's time, not this worker's."""
        with self._lock:
            end = self._ended
            self._ended = None
            if end is None or not alone or not 0 < queued_at <= end <= at:
                return
            ms = workload_ms(at - end, self.time_scale)
            mean = ms if self._mean is None else self._mean + self.alpha * (ms - self._mean)
            self._mean = mean
            self.samples += 1
            if abs(mean - self._published) >= max(STEP_MS, STEP_SHARE * self._published):
                self._published = round(mean, 1)

    def ms(self) -> float:
        """The learned hop to publish (workload ms, 0 before the first back-to-back gap):
        the mean, to a tenth of a ms, once it moved a step from what was published."""
        with self._lock:
            return self._published
