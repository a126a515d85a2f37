"""The simulated autoscaling provider: cold starts, preloads, drains, billing, the
autoscalers and the traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass_celery.planner.cost import MS_PER_S
from compass_celery.sim import scaling, traces
from compass_celery.sim.options import SimOptions
from compass_celery.sim.runner import Simulation
from compass_celery.workload import load_workload

WORKLOAD = load_workload(Path(__file__).parents[2] / "dags" / "autoscale-mix.json")


def simulation(workers: int = 2, jobs: int = 200, rate: float = 10.0) -> Simulation:
    stream = [(i * MS_PER_S / rate, name) for i, name in
              enumerate(["search", "document", "caption_translate"] * (jobs // 3))]
    return Simulation(WORKLOAD, "compass", stream, SimOptions(workers=workers, rate=rate,
                                                              warm=True))


def test_a_new_worker_takes_work_after_its_cold_start_and_loads_its_hint() -> None:
    sim = simulation()
    fleet = scaling.Fleet(sim, WORKLOAD.cluster.workers[0], cold_ms=500.0)
    sim.engine.at(1000.0, fleet.add, ("captioner", "ocr"))
    sim.run(1400.0)
    assert "s0001" not in {w.name for w in sim.cluster.workers}  # still starting
    assert [m.ready for m in fleet.members()] == [True, True, False]
    sim.run(1500.0)
    worker = sim.cluster.by_name["s0001"]
    assert worker in sim.cluster.workers
    assert set(worker.decider.loading) | set(worker.decider.resident) == {"captioner", "ocr"}
    sim.run()
    assert worker.loads >= 2 and fleet.cold_starts == 1


def test_a_drained_worker_leaves_placement_runs_what_it_holds_and_stops_billing() -> None:
    sim = simulation(workers=3, jobs=300, rate=40.0)
    fleet = scaling.Fleet(sim, WORKLOAD.cluster.workers[0], cold_ms=500.0)
    victim = sim.cluster.workers[0]
    held: list[int] = []

    def drain() -> None:
        held.append(len(victim.queue) + (victim.running is not None))
        fleet.drain(victim.name)

    sim.engine.at(2000.0, drain)
    jobs = sim.run()
    assert held[0] > 0  # it had work when it was drained, and ran it
    assert victim not in sim.cluster.workers and victim.name not in fleet.since
    assert all(j.end is not None for j in jobs)  # every job ended one way
    assert not any(j.failed for j in jobs)
    late = [t for j in jobs for t in j.tasks if t.sent_at > 2000.0]
    assert not any(t.where is victim for t in late)
    # billed: the victim from 0 to its drain's end, the others until close
    end = max(j.end for j in jobs)
    fleet.close(end)
    assert 2 * end + 2000.0 < fleet.billed_ms < 3 * end


def test_fixed_peak_never_scales_and_compass_plan_follows_a_step() -> None:
    trace = traces.step(60.0, 24.0, compression=120.0)
    fixed = scaling.run(WORKLOAD, "fixed-peak", scaling.Setup(trace))
    assert fixed["cold_starts"] == 0
    assert fixed["workers"]["peak"] == scaling.steady_workers(WORKLOAD, 24.0)
    three = scaling.run(WORKLOAD, "fixed-peak:3", scaling.Setup(trace))
    assert three["workers"] == {"mean": 3.0, "peak": 3}
    plan = scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace))
    counts = [n for _, n in plan["timeline"]]
    assert max(counts) >= scaling.steady_workers(WORKLOAD, 24.0) > counts[0]
    assert counts[-1] < max(counts)  # it scaled back in after the step
    assert plan["gpu_hours"] < fixed["gpu_hours"]
    # billed per second alive: the worker count over time, integrated
    line = plan["timeline"]
    area = sum((t1 - t0) * n for (t0, n), (t1, _) in zip(line, line[1:], strict=False))
    assert plan["worker_s"] == pytest.approx(area, abs=0.1 * len(line))
    # a fivefold step outruns any reactive rule for one cold start: some admitted jobs
    # are shed then (the 99% target is for the diurnal and bursty traces)
    assert plan["slo"]["all"]["admitted_attainment"] >= 0.95
    assert plan["completed"] + plan["slo"]["all"]["rejected"] + plan["slo"]["all"]["shed"] \
        == plan["jobs"]


def test_compass_plan_records_what_it_read_at_each_tick_when_asked() -> None:
    """The per-tick readings (rates, need, target) a real run's controller records too,
    to compare the two tick by tick: one per tick, on the poll's schedule, with the
    targets the fleet followed; left out unless asked for."""
    trace = traces.step(60.0, 24.0, compression=120.0)
    plain = scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace))
    plan = scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace, readings=True))
    assert "readings" not in plain and plan["timeline"] == plain["timeline"]
    ticks = plan["readings"]
    poll = scaling.KEDA_POLL_S / trace.compression
    assert [r["t"] for r in ticks] == pytest.approx([poll * k for k in
                                                     range(1, len(ticks) + 1)])
    assert len(ticks) == int(trace.duration_s / poll - 1e-9)
    assert set(ticks[-1]["rates"]) == {"interactive", "standard"}
    assert max(r["target"] for r in ticks) == max(n for _, n in plan["timeline"])
    assert all(r["target"] >= max(r["now"], r["horizon"]) for r in ticks)  # held, damped
    peak = max(ticks, key=lambda r: sum(v[0] for v in r["rates"].values()))
    assert peak["work"] > ticks[0]["work"]


def test_the_baselines_scale_on_messages_and_name_bad_targets() -> None:
    trace = traces.step(40.0, 24.0, compression=120.0)
    keda = scaling.run(WORKLOAD, "keda-queue:1", scaling.Setup(trace))
    assert keda["cold_starts"] > 0
    with pytest.raises(ValueError, match="autoscaler"):
        scaling.run(WORKLOAD, "hpa", scaling.Setup(trace))
    with pytest.raises(ValueError, match="number"):
        scaling.run(WORKLOAD, "keda-queue:x", scaling.Setup(trace))
    with pytest.raises(ValueError, match="variants"):
        scaling.parse("compass-plan:3")
    with pytest.raises(ValueError, match="whole number"):
        scaling.parse("fixed-peak:2.5")
    assert scaling.parse("fixed-peak:3") == ("fixed-peak", 3.0, "")
    assert scaling.parse("compass-plan:newest") == ("compass-plan", None, "newest")


def test_compass_plan_takes_its_sizing_knobs_and_refuses_unknown_ones() -> None:
    assert scaling.plan_knobs("no-hints+headroom=0.8+down=60") == (
        "no-hints", {**scaling.PLAN_KNOBS, "headroom": 0.8, "down": 60.0})
    for bad, says in (("speed=2", "knobs"), ("headroom=x", "number"),
                      ("headroom=0", "> 0"), ("fast", "variants"), ("recent=3", "0, 1 or 2"),
                      ("short=0", "> 0")):
        with pytest.raises(ValueError, match=says):
            scaling.parse(f"compass-plan:{bad}")
    trace = traces.step(30.0, 24.0, compression=120.0)
    lean = scaling.run(WORKLOAD, "compass-plan:headroom=0.6", scaling.Setup(trace))
    ample = scaling.run(WORKLOAD, "compass-plan:headroom=1.5", scaling.Setup(trace))
    assert lean["worker_s"] < ample["worker_s"]  # the knob reaches the rule
    assert scaling.plan_knobs("short=30+recent=2")[1]["recent"] == 2.0


def test_compass_plan_looks_ahead_one_cold_start_unless_told(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The horizon is the time a worker asked for now takes to take work: the setup's cold
    start (compressed), or the horizon knob when it is set."""
    seen: list[float] = []
    real = scaling.decide

    def spy(*args: object, **kw: object) -> object:
        seen.append(float(kw["horizon_s"]))  # type: ignore[arg-type]
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(scaling, "decide", spy)
    trace = traces.step(6.0, 10.0, compression=120.0)
    scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace, cold_start_s=30.0))
    assert seen and all(h == pytest.approx(30.0 / 120.0) for h in seen)
    seen.clear()
    scaling.run(WORKLOAD, "compass-plan:horizon=240", scaling.Setup(trace, cold_start_s=30.0))
    assert seen and all(h == pytest.approx(240.0 / 120.0) for h in seen)


def test_the_classes_carry_their_priority_and_the_levels_knob_reaches_the_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Interactive jobs run first (level 9), standard ones as batch (0): the rule sizes
    by level unless ``levels=0``."""
    levels = {c.name: c.priority for c in scaling.loads_at(WORKLOAD, {})}
    assert levels == {"interactive": 9, "standard": 0}
    seen: list[bool] = []
    real = scaling.decide

    def spy(*args: object, **kw: object) -> object:
        seen.append(bool(kw["by_level"]))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(scaling, "decide", spy)
    trace = traces.step(6.0, 10.0, compression=120.0)
    scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace))
    assert seen and all(seen)
    seen.clear()
    scaling.run(WORKLOAD, "compass-plan:levels=0", scaling.Setup(trace))
    assert seen and not any(seen)


def test_traces_have_their_shape_and_are_seeded() -> None:
    day = traces.diurnal(240.0, 30.0, low=0.1)
    assert day.rate(40.0) == pytest.approx(3.0)  # 04:00, the trough
    assert day.rate(160.0) == pytest.approx(30.0)  # 16:00, the peak
    assert day.compression == pytest.approx(360.0)
    times = day.times_ms(3)
    assert times == day.times_ms(3) != day.times_ms(4)
    assert len(times) == pytest.approx(day.mean_per_s() * 240.0, rel=0.05)
    step = traces.make("step", 90.0, 10.0)
    assert [step.rate(t) for t in (10.0, 45.0, 80.0)] == [2.0, 10.0, 2.0]
    with pytest.raises(ValueError, match="trace"):
        traces.make("sawtooth", 10.0, 1.0)


def test_the_command_prints_and_writes_the_table(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    out = tmp_path / "autoscale.txt"
    result = CliRunner().invoke(compass_command, [
        "autoscale", "--traces", "step", "--autoscalers", "compass-plan,fixed-peak",
        "--duration-s", "30", "--peak", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("$ compass-celery autoscale --workload autoscale-mix --traces step "
                           "--autoscalers compass-plan,fixed-peak --duration-s 30 --peak 10")
    table, _, summary = text.partition("\n\n" + "saves: ")
    rows = [line.split() for line in table.splitlines() if line.startswith("step ")]
    assert [r[1] for r in rows] == ["compass-plan", "fixed-peak"]
    assert summary.splitlines()[-2].startswith("step compass-plan: ")  # the comparison
    assert "fixed-peak (" in summary.splitlines()[-2]
    floor = summary.splitlines()[-1]  # and what any autoscaler must hold on that trace
    assert floor.startswith("step floor: ") and "against fixed-peak" in floor
    bad = CliRunner().invoke(compass_command, ["autoscale", "--autoscalers", "hpa"])
    assert bad.exit_code != 0 and "got 'hpa'" in bad.output


def _row(gpu_hours: float, admitted: float, everyone: float) -> dict[str, object]:
    return {"gpu_hours": gpu_hours,
            "slo": {"all": {"admitted_attainment": admitted, "attainment": everyone}}}


def test_the_baseline_to_beat_serves_about_as_many_jobs_not_only_its_admitted() -> None:
    rows = {"compass-plan": _row(70.0, 0.995, 0.965),
            "keda-queue": _row(60.0, 0.983, 0.90),   # under 99% of admitted
            "keda-queue:3": _row(90.0, 0.995, 0.94),  # 99% of admitted by refusing more
            "keda-queue:2": _row(120.0, 0.998, 0.956),  # within 1 point of the plan's
            "keda-queue:1": _row(150.0, 0.999, 0.97),
            "fixed-peak": _row(120.0, 0.999, 0.996)}
    assert scaling.comparator(rows, "keda-queue") == "keda-queue:2"
    s = scaling.saving(rows, "keda-queue")
    assert s["against"] == "keda-queue:2" and s["saves"] == pytest.approx(1 - 70 / 120)
    assert s["plan_holds"]
    # the plan refusing more lets the coarser setting count again (symmetric)
    rows["compass-plan"] = _row(70.0, 0.995, 0.949)
    assert scaling.comparator(rows, "keda-queue") == "keda-queue:3"
    # without the all-jobs bar the coarse setting would count at any gap
    assert scaling.comparator(rows, "keda-queue", all_slack=1.0) == "keda-queue:3"
    rows["compass-plan"] = _row(70.0, 0.995, 0.99)
    assert scaling.comparator(rows, "keda-queue") is None
    s = scaling.saving(rows, "keda-queue")
    assert s["saves"] is None and s["closest"] == "keda-queue:3"  # a bound, named as one
    assert s["saves_closest"] == pytest.approx(1 - 70 / 90)
    assert "no row serves as well; the cheapest at 99% of admitted, keda-queue:3" in \
        scaling.summary({"t": rows})
    # compass-plan under 99% of its admitted claims no saving
    rows["compass-plan"] = _row(50.0, 0.985, 0.97)
    s = scaling.saving(rows, "keda-queue")
    assert (s["against"], s["saves"], s["plan_holds"]) == ("keda-queue:1", None, False)
    assert scaling.saving(rows, "fixed-peak", plan="compass-plan")["against"] == "fixed-peak"
    text = scaling.summary({"diurnal": rows})
    assert "under 99%: no saving claimed" in text and "keda-queue:1 (150.0 GPU-h" in text


def test_the_rate_window_knobs_reach_the_rate_window(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    made: list[scaling.RateWindow] = []

    class Recorded(scaling.RateWindow):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            made.append(self)

    monkeypatch.setattr(scaling, "RateWindow", Recorded)
    trace = traces.step(10.0, 10.0, compression=120.0)
    scaling.run(WORKLOAD, "compass-plan", scaling.Setup(trace))
    scaling.run(WORKLOAD, "compass-plan:window=960+short=30+recent=2+pooled=1",
                scaling.Setup(trace))
    default, knobbed = made
    assert (default.short_s, default.recent_on_trend, default.pooled) == (60.0 / 120.0, 0,
                                                                          False)
    assert knobbed.window_s == 8.0 and knobbed.short_s == 0.25
    assert knobbed.recent_on_trend == 2 and knobbed.pooled


def test_the_floor_is_the_whole_workers_a_perfect_fleet_holds() -> None:
    workload = WORKLOAD
    busy = scaling.busy_s_per_job(workload)
    assert 0 < busy < 1
    # a flat day at a rate that keeps 2.5 workers busy: any fleet holds 3 all day
    flat = traces.step(100.0, 2.5 / busy, low=1.0, compression=36.0)
    assert scaling.floor_gpu_hours(workload, flat, steps=1000) == pytest.approx(3 * 100 * 36 / 3600)
    # at 80% busy it takes ceil(2.5 / 0.8) = 4; an idle day still holds one worker
    assert scaling.floor_gpu_hours(workload, flat, util=0.8, steps=1000) == pytest.approx(4.0)
    idle = traces.step(100.0, 1e-6, low=1.0, compression=36.0)
    assert scaling.floor_gpu_hours(workload, idle, steps=1000) == pytest.approx(1.0)
    rows = {"compass-plan": _row(80.0, 0.995, 0.965), "keda-queue:2": _row(100.0, 0.998, 0.96)}
    text = scaling.summary({"day": rows}, {"day": 75.0})
    assert "day floor: 75.0 GPU-h" in text and "compass-plan +6.7% above it" in text
    assert "the most any autoscaler could save: 25.0% against keda-queue:2" in text
