"""Whether the simulator agrees with the real cluster, workload by workload: the criterion.

One real run is one outcome, and so is one simulation: a workload is run again on fresh
arrival streams (three or more reruns), each simulated several times on independent
draws of the measured per-task costs. The simulator agrees when the real mean, pooled
over the reruns, lies within the range the simulated means, pooled the same way, take
over the draws; and when the real model loads after warm-up, pooled, are within 1.3x of
the simulated ones or within 0.5% of the tasks (a handful of cold loads, where one more
or less moves a ratio by tens of percent). Pure: figures in, verdict out; the reading of
saved runs (:func:`rerun_of`) and the table are beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Reruns the criterion pools at least.
MIN_RERUNS = 3
#: Real loads within this factor of the simulated ones agree.
LOADS_FACTOR = 1.3
#: ... or within this share of the tasks after warm-up.
LOADS_TASK_SHARE = 0.005


@dataclass(frozen=True)
class Rerun:
    """One real run on one arrival stream, and its simulations on the same arrivals.

    ``sim_means_ms``: each draw's mean latency in draw order (or, from runs that kept
    only those, the least and largest with ``ends_only``); ``sim_loads``: each draw's
    model loads after warm-up (or the median draw's alone); ``tasks``: the real run's
    tasks after warm-up; ``jobs``: its completed jobs after warm-up (the mean's weight)."""

    real_mean_ms: float
    sim_means_ms: tuple[float, ...]
    real_loads: int
    sim_loads: tuple[int, ...]
    tasks: int
    jobs: int = 1
    ends_only: bool = False


@dataclass(frozen=True)
class Verdict:
    """The criterion's answer for one workload: whether it passed, which part did not
    and why, with the pooled figures it judged."""

    passed: bool
    mean_ok: bool
    loads_ok: bool
    reason: str
    real_mean_ms: float
    sim_low_ms: float
    sim_high_ms: float
    real_loads: int
    sim_loads: float
    tasks: int


def _pooled(values: Sequence[float], weights: Sequence[int]) -> float:
    return sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)


def sim_range(reruns: Sequence[Rerun]) -> tuple[float, float, bool]:
    """The least and largest pooled simulated mean over the draws, and whether it is only
    bounded (runs that kept each draw's mean pool draw k with draw k: each pooled draw is
    one simulated outcome of the whole set of reruns; runs that kept only their least and
    largest pool those, a range at least as wide)."""
    weights = [r.jobs for r in reruns]
    counts = {len(r.sim_means_ms) for r in reruns}
    if not any(r.ends_only for r in reruns) and len(counts) == 1:
        pooled = [
            _pooled([r.sim_means_ms[k] for r in reruns], weights) for k in range(counts.pop())
        ]
        return min(pooled), max(pooled), False
    return (
        _pooled([min(r.sim_means_ms) for r in reruns], weights),
        _pooled([max(r.sim_means_ms) for r in reruns], weights),
        True,
    )


def pooled_sim_loads(reruns: Sequence[Rerun]) -> float:
    """The simulated loads after warm-up summed over the reruns: the median over draws of
    draw k's sum where every run kept each draw's, else the sum of each run's median."""
    counts = {len(r.sim_loads) for r in reruns}
    if len(counts) == 1 and (n := counts.pop()) > 1:
        return statistics.median(sum(r.sim_loads[k] for r in reruns) for k in range(n))
    return sum(statistics.median(r.sim_loads) for r in reruns)


def loads_agree(real: float, sim: float, tasks: int) -> bool:
    """Real and simulated loads within :data:`LOADS_FACTOR` of each other, or apart by
    no more than :data:`LOADS_TASK_SHARE` of ``tasks``."""
    if abs(real - sim) <= LOADS_TASK_SHARE * tasks:
        return True
    return min(real, sim) > 0 and max(real, sim) / min(real, sim) <= LOADS_FACTOR


def judge(reruns: Sequence[Rerun]) -> Verdict:
    """The criterion over one workload's reruns (at least :data:`MIN_RERUNS`)."""
    if len(reruns) < MIN_RERUNS:
        raise ValueError(f"the criterion pools {MIN_RERUNS} or more reruns, got {len(reruns)}")
    if any(not r.sim_means_ms or not r.sim_loads or r.jobs < 1 for r in reruns):
        raise ValueError("every rerun needs its simulated means and loads and a job")
    real = _pooled([r.real_mean_ms for r in reruns], [r.jobs for r in reruns])
    low, high, bounded = sim_range(reruns)
    loads, sim_loads = sum(r.real_loads for r in reruns), pooled_sim_loads(reruns)
    tasks = sum(r.tasks for r in reruns)
    mean_ok, loads_ok = low <= real <= high, loads_agree(loads, sim_loads, tasks)
    why = []
    if real > high:
        why.append(
            f"real mean {real:.1f} ms above the simulated {low:.1f}-{high:.1f} "
            f"({real / high:.3f}x the largest)"
        )
    elif real < low:
        why.append(
            f"real mean {real:.1f} ms below the simulated {low:.1f}-{high:.1f} "
            f"({real / low:.3f}x the least)"
        )
    if not loads_ok:
        ratio = f"{loads / sim_loads:.2f}x" if sim_loads else "none simulated"
        why.append(
            f"loads {loads} against {sim_loads:g} simulated ({ratio}; "
            f"{abs(loads - sim_loads) / max(tasks, 1):.2%} of {tasks} tasks)"
        )
    if not why:
        why.append(
            f"real mean {real:.1f} ms within {low:.1f}-{high:.1f}; loads {loads} "
            f"against {sim_loads:g}"
        )
    if bounded:
        why.append("range from each run's least and largest draw")
    return Verdict(
        mean_ok and loads_ok,
        mean_ok,
        loads_ok,
        "; ".join(why),
        round(real, 1),
        round(low, 1),
        round(high, 1),
        loads,
        sim_loads,
        tasks,
    )


def rerun_of(
    result: Mapping[str, Any],
    tasks_per_job: Mapping[str, int],
    policy: str = "compass",
    warmup_frac: float = 0.1,
) -> Rerun:
    """One saved ``bench cluster --compare-sim`` result (its ``simulated_drawn_spread``)
    as a :class:`Rerun`; ``tasks_per_job``: each template's node count."""
    real = result["policies"][policy]
    spread = result["simulated_drawn_spread"][policy]
    per_job = real.get("per_job") or []
    skip = int(len(per_job) * warmup_frac)
    done = [
        j
        for j in per_job
        if j["i"] >= skip
        and j.get("latency_ms") is not None
        and j.get("outcome") in ("met", "late")
    ]
    taken = [j for j in per_job if j["i"] >= skip and j.get("outcome") not in ("rejected", "shed")]
    means = spread.get("draw_means_ms")
    return Rerun(
        real_mean_ms=float(real["latency_ms"]["mean"]),
        sim_means_ms=tuple(means)
        if means
        else (spread["mean_ms"]["min"], spread["mean_ms"]["max"]),
        real_loads=int(real.get("loads_after_warmup", 0)),
        sim_loads=tuple(spread.get("draw_loads") or (spread["loads_after_warmup"]["median"],)),
        tasks=sum(tasks_per_job[j["dag"]] for j in taken),
        jobs=max(len(done), 1),
        ends_only=not means,
    )


def table(groups: Iterable[tuple[str, float, Sequence[Rerun]]]) -> str:
    """The Markdown table of the verdicts, one row per workload and time scale, and a
    count of those that passed."""
    lines = [
        "| workload | time scale | reruns | real mean ms (pooled) | simulated over the "
        "draws, ms | loads: real / simulated (tasks) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    passed = total = 0
    for name, scale, reruns in groups:
        v = judge(reruns)
        total += 1
        passed += v.passed
        lines.append(
            f"| {name} | {scale:g} | {len(reruns)} | {v.real_mean_ms:,.1f} | "
            f"{v.sim_low_ms:,.1f}-{v.sim_high_ms:,.1f} | {v.real_loads} / "
            f"{v.sim_loads:g} ({v.tasks:,}) | "
            f"{'pass' if v.passed else 'FAIL'}: {v.reason} |"
        )
    lines.append(f"\n{passed} of {total} pass.")
    return "\n".join(lines)
