"""Arrival traces for the autoscaling comparison: a diurnal day, a bursty one and a step.

Each trace is a rate curve (jobs per second against workload seconds) turned into
arrival times by thinning a Poisson process (Lewis and Shedler), seeded, so the same
arguments give the same stream. A day is compressed to ``duration_s``: an hour of the
day lasts ``duration_s / 24`` seconds, and :attr:`Trace.compression` says by how much
(an autoscaler's real periods are divided by it, ``sim.scaling``); a shorter trace may
name its own compression.

- ``diurnal``: a trough at ``low`` of the peak at 04:00 and the peak at 16:00 (a cosine
  over the day, as request traces of user-facing services look).
- ``bursty``: a base at ``low`` of the peak with bursts to the peak, each lasting
  ``burst_s`` (compressed), at random moments (on average ``bursts`` of them).
- ``step``: the base, then the peak from a third to two thirds of the run, then the base.

Pure: no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds in the day a trace compresses.
DAY_S = 86_400.0
TRACES = ("diurnal", "bursty", "step")


@dataclass(frozen=True)
class Trace:
    """A named rate curve over ``duration_s`` workload seconds, peaking at ``peak``."""

    name: str
    duration_s: float
    peak_per_s: float
    rate: Callable[[float], float]
    #: Real seconds per workload second of the trace (a day over its duration).
    compression: float

    def times_ms(self, seed: int) -> list[float]:
        """Arrival times (workload ms) drawn from the rate curve by thinning."""
        rng = random.Random(f"{seed}:{self.name}")
        out: list[float] = []
        t = 0.0
        while True:
            t += rng.expovariate(self.peak_per_s)
            if t >= self.duration_s:
                return out
            if rng.random() * self.peak_per_s <= self.rate(t):
                out.append(t * 1000.0)

    def mean_per_s(self, steps: int = 2000) -> float:
        """The curve's mean rate (for reports)."""
        dt = self.duration_s / steps
        return sum(self.rate((i + 0.5) * dt) for i in range(steps)) / steps


def diurnal(duration_s: float, peak_per_s: float, low: float = 0.15,
            compression: float | None = None) -> Trace:
    """A day: trough ``low x peak`` at 04:00, peak at 16:00."""
    def rate(t: float) -> float:
        hour = 24.0 * t / duration_s
        return peak_per_s * (low + (1 - low) * (1 - math.cos(2 * math.pi * (hour - 4) / 24)) / 2)

    return Trace("diurnal", duration_s, peak_per_s, rate, compression or DAY_S / duration_s)


def bursty(duration_s: float, peak_per_s: float, low: float = 0.2, bursts: int = 6,
           burst_s: float = 10.0, seed: int = 0, compression: float | None = None) -> Trace:
    """The base rate with ``bursts`` bursts to the peak, each ``burst_s`` long."""
    rng = random.Random(f"{seed}:bursts")
    starts = sorted(rng.uniform(0.05, 0.9) * duration_s for _ in range(bursts))

    def rate(t: float) -> float:
        on = any(s <= t < s + burst_s for s in starts)
        return peak_per_s if on else low * peak_per_s

    return Trace("bursty", duration_s, peak_per_s, rate, compression or DAY_S / duration_s)


def step(duration_s: float, peak_per_s: float, low: float = 0.2,
         compression: float | None = None) -> Trace:
    """The base, the peak over the middle third, the base again."""
    def rate(t: float) -> float:
        return peak_per_s if duration_s / 3 <= t < 2 * duration_s / 3 else low * peak_per_s

    return Trace("step", duration_s, peak_per_s, rate, compression or DAY_S / duration_s)


def make(name: str, duration_s: float, peak_per_s: float, seed: int = 0,
         compression: float | None = None) -> Trace:
    """The trace ``name`` (one of ``TRACES``) with default shape parameters; each is a day
    compressed to ``duration_s`` unless ``compression`` says otherwise."""
    if name == "diurnal":
        return diurnal(duration_s, peak_per_s, compression=compression)
    if name == "bursty":
        return bursty(duration_s, peak_per_s, seed=seed, compression=compression)
    if name == "step":
        return step(duration_s, peak_per_s, compression=compression)
    raise ValueError(f"trace: expected one of {', '.join(TRACES)}, got {name!r}")
