"""The per-task cost a simulated worker pays beyond a task's planned run, task by task.

A real worker spends time between tasks (bookkeeping, the ack, the next message's fetch)
and its runs overshoot what was planned; the benchmark measures both. Fed their mean,
the simulator adds the same to every task. Fed the measured values themselves, it draws
one hop and one overshoot for each task, so a job that fans out and joins its branches
waits for the slowest, as a real one does, and not for the mean. Draws come from a
generator seeded per run: the same inputs give the same simulation.

A job's critical path pays two more costs that keep no worker busy in the simulator's
sense but delay the job: from a task's recorded end to its released successors' send
(the finishing worker stores the result, counts the join, places and sends the
successor; a source's from its job's record), and what the job's sender waits beyond
its last task's end (its own plan before the record and the answer's delivery). The
hop already counts the first as the busy worker's time; fed the measured ones, the
simulator also delays the successors and the answer by them, drawn per send and per job.

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
    and its run's overshoot (none: nothing added); the delays from a task's end to its
    successors' send (``releases_ms``) and from a job's last end to its sender's answer
    (``answers_ms``; none: no delay, as before they were measured). ``draw``
    picks one of independent, reproducible streams of draws (0: the run's own seed)."""

    hops_ms: tuple[float, ...]
    overshoots_ms: tuple[float, ...] = ()
    draw: int = 0
    releases_ms: tuple[float, ...] = ()
    answers_ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, hops_ms: Sequence[float], overshoots_ms: Sequence[float] = (),
           releases_ms: Sequence[float] = (), answers_ms: Sequence[float] = ()
           ) -> MeasuredHops | None:
        """The measured costs, or ``None`` when no hop was measured (a constant then)."""
        hops = tuple(float(h) for h in hops_ms)
        if not hops:
            return None
        return cls(hops, tuple(float(o) for o in overshoots_ms),
                   releases_ms=tuple(float(r) for r in releases_ms),
                   answers_ms=tuple(float(a) for a in answers_ms))

    def sampler(self, seed: int) -> Callable[[], float]:
        """A draw per call: a measured hop plus a measured overshoot (never below 0)."""
        rng = random.Random(seed if self.draw == 0 else f"{seed}/{self.draw}")
        hops, overs = self.hops_ms, self.overshoots_ms or (0.0,)
        return lambda: max(rng.choice(hops) + rng.choice(overs), 0.0)

    def delays(self, seed: int) -> tuple[Callable[[], float], Callable[[], float]] | None:
        """Draws of a send's release and of a job's answer delay (never below 0), from
        streams of their own (the hops drawn stay those drawn without them); ``None``
        when neither was measured."""
        if not self.releases_ms and not self.answers_ms:
            return None
        rng = random.Random(f"{seed}/{self.draw}/delays")
        releases, answers = self.releases_ms or (0.0,), self.answers_ms or (0.0,)
        return (lambda: max(rng.choice(releases), 0.0),
                lambda: max(rng.choice(answers), 0.0))


def spread_of(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per policy, over ``runs`` (each a simulation's ``policies``): the run whose mean
    latency is the median (the upper one of an even count) under ``run``, and the least,
    median and largest mean latency and loads after warm-up; ``draw_means_ms`` and
    ``draw_loads`` keep every draw's, in draw order (to pool draws across reruns)."""
    out: dict[str, dict[str, Any]] = {}
    for name in runs[0]:
        ordered = sorted((r[name] for r in runs), key=lambda r: r["latency_ms"]["mean"])
        means = [r["latency_ms"]["mean"] for r in ordered]
        loads = sorted(r.get("loads_after_warmup", 0) for r in ordered)
        mid = len(ordered) // 2
        out[name] = {"draws": len(ordered), "run": ordered[mid],
                     "draw_means_ms": [r[name]["latency_ms"]["mean"] for r in runs],
                     "draw_loads": [r[name].get("loads_after_warmup", 0) for r in runs],
                     "mean_ms": {"min": means[0], "median": means[mid], "max": means[-1]},
                     "loads_after_warmup": {"min": loads[0], "median": loads[mid],
                                            "max": loads[-1]}}
    return out
