"""The per-task cost a simulated worker pays beyond a task's planned run, task by task.

A real worker spends time between tasks (bookkeeping, the ack, the next message's fetch)
and its runs overshoot what was planned; the benchmark measures both. Fed their mean,
the simulator adds the same to every task. Fed the measured values themselves, it draws
one hop and one overshoot for each task, so a job that fans out and joins its branches
waits for the slowest, as a real one does, and not for the mean. Draws come from a
generator seeded per run: the same inputs give the same simulation.

One draw is one outcome among many: on a busy cluster whose jobs fan out and join, which
task drew the long hop moves the mean by tens of percent. :func:`spread_of` summarises a
simulation repeated over independent draws (``MeasuredHops.draw``), so a real run is
compared with the simulator's range and not with one of its outcomes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MeasuredHops:
    """Measured per-task costs to draw from (workload ms): the gaps a busy worker paid
    between tasks, and what each task took beyond its plan and that gap, its start-up
    and its run's overshoot (none: nothing added). ``draw``
    picks one of independent, reproducible streams of draws (0: the run's own seed)."""

    hops_ms: tuple[float, ...]
    overshoots_ms: tuple[float, ...] = ()
    draw: int = 0

    @classmethod
    def of(cls, hops_ms: Sequence[float], overshoots_ms: Sequence[float] = ()
           ) -> MeasuredHops | None:
        """The measured costs, or ``None`` when no hop was measured (a constant then)."""
        hops = tuple(float(h) for h in hops_ms)
        return cls(hops, tuple(float(o) for o in overshoots_ms)) if hops else None

    def sampler(self, seed: int) -> Callable[[], float]:
        """A draw per call: a measured hop plus a measured overshoot (never below 0)."""
        rng = random.Random(seed if self.draw == 0 else f"{seed}/{self.draw}")
        hops, overs = self.hops_ms, self.overshoots_ms or (0.0,)
        return lambda: max(rng.choice(hops) + rng.choice(overs), 0.0)


def spread_of(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per policy, over ``runs`` (each a simulation's ``policies``): the run whose mean
    latency is the median (the upper one of an even count) under ``run``, and the least,
    median and largest mean latency and loads after warm-up."""
    out: dict[str, dict[str, Any]] = {}
    for name in runs[0]:
        ordered = sorted((r[name] for r in runs), key=lambda r: r["latency_ms"]["mean"])
        means = [r["latency_ms"]["mean"] for r in ordered]
        loads = sorted(r.get("loads_after_warmup", 0) for r in ordered)
        mid = len(ordered) // 2
        out[name] = {"draws": len(ordered), "run": ordered[mid],
                     "mean_ms": {"min": means[0], "median": means[mid], "max": means[-1]},
                     "loads_after_warmup": {"min": loads[0], "median": loads[mid],
                                            "max": loads[-1]}}
    return out
