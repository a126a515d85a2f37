"""``bench --compare-sim``: the same arrivals simulated, real against simulated latency."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..tables import text_table

if TYPE_CHECKING:
    from ..sim.hops import MeasuredHops
    from ..sim.options import SimOptions



def per_task_cost(result: dict[str, Any], real: bool, workload: Any = None,
                  warmup_frac: float = 0.1) -> tuple[float, str, MeasuredHops | None]:
    """What each task cost the real workers beyond its run, for the simulator's hop (ms;
    the median over policies) and how it is made up: the mean hop (the busy time the
    hops took), the median start-up of a task on a resident model (its inputs and
    bookkeeping before the run) and, on emulated GPUs, the median overshoot of a run
    over its declared time (a real-compute run feeds the simulator measured run times
    instead). Last, that policy's measured hops and per-task overshoots themselves, to
    draw task by task (``None`` where the run kept no hops), with, given the
    ``workload`` the run ran, the delays of its sends and answers
    (:func:`~compass_celery.bench.terms.release_delays`)."""
    from ..bench.terms import run_overshoot_ms, startup_ms, task_overshoots
    from ..sim.hops import MeasuredHops

    parts = []  # (mean hop, start-up, run overshoot, the measured ones) per policy
    for r in result["policies"].values():
        hop = r.get("hop_mean_ms") or r.get("hop_ms")
        if hop:
            rows = r.get("prediction_rows", [])
            parts.append((hop, startup_ms(rows),
                          0.0 if real else max(0.0, run_overshoot_ms(rows)),
                          MeasuredHops.of(r.get("hop_gaps_ms") or [],
                                          task_overshoots(rows, real),
                                          *_delays(r, workload, warmup_frac))))
    if not parts:
        return 0.0, "", None
    hop, start, over, measured = sorted(parts, key=lambda p: sum(p[:3]))[len(parts) // 2]
    why = f"mean hop {hop:g} ms" + (f" + start-up {start:g} ms" if start else "") + (
        f" + run overshoot {over:g} ms" if over else "")
    return round(hop + start + over, 1), why, measured


def _delays(run: dict[str, Any], workload: Any, warmup_frac: float
            ) -> tuple[list[float], list[float]]:
    """A policy's measured send and answer delays (none without its workload's
    templates, or where its rows do not match its jobs)."""
    from ..bench.terms import release_delays

    if workload is None:
        return [], []
    per_job = run.get("per_job") or []
    skip = int(len(per_job) * warmup_frac)
    jobs = [j for j in per_job if j["i"] >= skip and j.get("latency_ms") is not None
            and j.get("outcome") in ("met", "late")]
    preds = {name: {n: spec.preds(n) for n in spec.nodes}
             for name, spec in workload.dags.items()}
    try:
        return release_delays(run.get("prediction_rows") or [], jobs, preds)
    except (KeyError, ValueError):
        return [], []


#: How many independent draws of the measured per-task costs ``--compare-sim`` simulates:
#: one draw is one outcome, and on a busy fan-out workload they differ by tens of percent.
SIM_DRAWS = 9


def compare_with_sim(result: dict[str, Any], workload: Any, real: bool,
                     cluster: SimOptions) -> None:
    """Simulate the same workload, arrivals and cluster (fed the measured costs after a
    real-compute run), and print real against simulated, per policy: at zero hop, with
    the measured per-task cost as a constant, and with it drawn task by task (the median
    of ``SIM_DRAWS`` independent draws, and their range). ``cluster`` holds the bench's
    worker count, rate, job count and warm-up share."""
    from ..sim.runner import simulate as run_sim
    from ..sim.runner import simulate_draws

    if real:  # the simulator replays the costs the CPUs really had
        from ..bench.measured import measured_workload

        rows = [row for r in result["policies"].values()  # every policy's measurements
                for row in r.get("prediction_rows", [])]
        workload = measured_workload(workload, rows)
        result["simulated_workload"] = workload.description
    hop, why, measured = per_task_cost(result, real, workload, cluster.warmup_frac)
    result["simulated_hop_ms"] = hop
    runs = [("zero hop overhead", "", 0.0, None)]
    if hop:
        runs.append((f"the measured per-task cost, {hop} ms ({why})", "_hop", hop, None))
    if hop and measured is not None:
        plus = (", each plus a start-up" + ("" if real else " and a run overshoot")
                if measured.overshoots_ms else "") + (
            f"; {len(measured.releases_ms)} sends' and {len(measured.answers_ms)} answers' "
            "delays" if measured.releases_ms else "")
        runs.append((f"the measured per-task costs drawn task by task "
                     f"({len(measured.hops_ms)} hops{plus}), the median of {SIM_DRAWS} "
                     "draws", "_drawn", hop, measured))
    names = list(result["policies"])
    for label, key, hop_ms, draws in runs:
        spread = None
        if draws is None:
            simulated = run_sim(workload, names, cluster, hop_ms=hop_ms)["policies"]
        else:
            spread = simulate_draws(workload, names, draws, SIM_DRAWS, cluster, hop_ms=hop_ms)
            simulated = {name: s.pop("run") for name, s in spread.items()}
            result[f"simulated{key}_spread"] = spread
        result[f"simulated{key}"] = simulated
        result[f"real_over_sim{key}"] = ratios = real_over_sim(result["policies"], simulated)
        click.echo(f"\nreal cluster against the simulator (same arrivals, {label}), "
                   "workload ms")
        click.echo(_real_sim_table(ratios))
        if spread is not None:
            click.echo(_spread_lines(spread, result["policies"]))
    click.echo("loads: model loads after warm-up, as a share of the tasks after warm-up")


def _spread_lines(spread: dict[str, Any], real: dict[str, Any]) -> str:
    """Per policy, the simulated means and loads over the draws, and where the real ones
    fall among them."""
    lines = []
    for name, s in spread.items():
        means, loads = s["mean_ms"], s["loads_after_warmup"]
        mean, loaded = real[name]["latency_ms"]["mean"], real[name].get("loads_after_warmup", 0)
        lines.append(f"  {name}: simulated mean {means['min']:.1f} to {means['max']:.1f} ms "
                     f"over {s['draws']} draws, real {mean:.1f} ({_where(mean, means)}); "
                     f"loads after warm-up {loads['min']} to {loads['max']}, real {loaded} "
                     f"({_where(loaded, loads)})")
    return "\n".join(lines)


def _where(value: float, span: dict[str, float]) -> str:
    if value > span["max"]:
        return f"{value / span['max']:.2f}x the largest" if span["max"] else "above"
    if value < span["min"]:
        return f"{value / span['min']:.2f}x the least"
    return "within"


def _real_sim_table(ratios: dict[str, Any]) -> str:
    return text_table([[name, f"{r['real_mean']:.1f}", f"{r['sim_mean']:.1f}",
                        f"{r['mean']:.2f}x", f"{r['real_p99']:.1f}", f"{r['sim_p99']:.1f}",
                        f"{r['p99']:.2f}x", _pct(r["real_load_fraction"]),
                        _pct(r["sim_load_fraction"])] for name, r in ratios.items()],
                      ["policy", "real mean", "sim mean", "real/sim", "real p99",
                       "sim p99", "real/sim", "real loads", "sim loads"])


def real_over_sim(real: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """Per policy: real and simulated mean and p99 latency, and their ratios."""
    out = {}
    for name, r in real.items():
        s = simulated.get(name)
        if s is None:
            continue
        rm, sm = r["latency_ms"]["mean"], s["latency_ms"]["mean"]
        rp, sp = r["latency_ms"]["p99"], s["latency_ms"]["p99"]
        out[name] = {"real_mean": rm, "sim_mean": sm, "mean": rm / sm if sm else float("nan"),
                     "real_p99": rp, "sim_p99": sp, "p99": rp / sp if sp else float("nan"),
                     "real_load_fraction": r.get("load_fraction"),
                     "sim_load_fraction": s.get("load_fraction")}
    return out


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


def resimulate(result: dict[str, Any], workload: Any, delays: bool = True,
               warmup_frac: float = 0.1) -> dict[str, Any]:
    """A saved ``--compare-sim`` result's drawn simulations made again on this simulator,
    from what the run measured (its hops, start-ups and overshoots and, with ``delays``,
    its sends' and answers' delays) on the same arrivals (``workload`` reseeded with the
    run's seed): the new ``simulated_drawn_spread``. ``SIM_DRAWS`` draws."""
    from dataclasses import replace

    from ..sim.options import SimOptions
    from ..sim.runner import simulate_draws

    hop, _, measured = per_task_cost(result, False, workload, warmup_frac)
    if measured is None:
        raise ValueError("the run kept no hops to draw from")
    if not delays:
        measured = replace(measured, releases_ms=(), answers_ms=())
    first = next(iter(result["policies"].values()))
    opts = SimOptions(rate=result.get("rate_per_s"), jobs=first["jobs"],
                      warmup_frac=warmup_frac)
    spread = simulate_draws(workload.reseeded(int(result["seed"])), list(result["policies"]),
                            measured, SIM_DRAWS, opts, hop_ms=hop)
    for s in spread.values():
        s.pop("run")
    return spread
