"""The per-task cost a simulated worker pays beyond a task's planned run, task by task.

A real worker spends time between tasks (bookkeeping, the ack, the next message's fetch)
and its runs overshoot what was planned; the benchmark measures both. Fed their mean,
the simulator adds the same to every task. Fed the measured values themselves, it draws
one hop and one overshoot for each task, so a job that fans out and joins its branches
waits for the slowest, as a real one does, and not for the mean. Draws come from a
generator seeded per run: the same inputs give the same simulation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredHops:
    """Measured per-task costs to draw from (workload ms): the gaps a busy worker paid
    between tasks, and how far runs overshot their plan (none: no overshoot)."""

    hops_ms: tuple[float, ...]
    overshoots_ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, hops_ms: Sequence[float], overshoots_ms: Sequence[float] = ()
           ) -> MeasuredHops | None:
        """The measured costs, or ``None`` when no hop was measured (a constant then)."""
        hops = tuple(float(h) for h in hops_ms)
        return cls(hops, tuple(float(o) for o in overshoots_ms)) if hops else None

    def sampler(self, seed: int) -> Callable[[], float]:
        """A draw per call: a measured hop plus a measured overshoot (never below 0)."""
        rng = random.Random(seed)
        hops, overs = self.hops_ms, self.overshoots_ms or (0.0,)
        return lambda: max(rng.choice(hops) + rng.choice(overs), 0.0)
