"""The simulator's per-task cost drawn task by task from measured hops and overshoots."""

from dataclasses import replace

import pytest

from compass_celery.sim.hops import MeasuredHops
from compass_celery.sim.options import SimOptions
from compass_celery.sim.runner import Simulation, simulate, simulate_draws
from compass_celery.workload import job_stream, load_workload


def test_draws_are_seeded_within_what_was_measured_and_never_negative():
    assert MeasuredHops.of([]) is None  # nothing measured: the constant hop is used
    hops = MeasuredHops.of([2.0, 5.0, 30.0], [-10.0, 1.0])
    one, two = hops.sampler(7), hops.sampler(7)
    first = [one() for _ in range(200)]
    assert [two() for _ in range(200)] == first  # the same seed, the same draws
    # a hop plus an overshoot, floored at 0: every pair turns up
    assert set(first) == {0.0, 3.0, 6.0, 20.0, 31.0}
    assert MeasuredHops.of([4.0]).sampler(1)() == 4.0  # no overshoot measured: none added


def test_one_measured_value_simulates_as_the_constant_it_is():
    w = load_workload("dags/vision-fanout.json")
    constant = simulate(w, ["compass"], jobs=60, hop_ms=12.0)["policies"]["compass"]
    drawn = simulate(w, ["compass"], jobs=60, hop_ms=12.0,
                     measured_hops=MeasuredHops.of([12.0]))["policies"]["compass"]
    assert drawn["latency_ms"] == constant["latency_ms"]
    assert drawn["breakdown_ms"] == constant["breakdown_ms"]


def test_a_spread_of_hops_makes_joined_branches_later_than_their_mean():
    # vision-fanout joins three branches: a job waits for its slowest one
    w = load_workload("dags/vision-fanout.json")
    constant = simulate(w, ["compass"], jobs=200, hop_ms=12.0)["policies"]["compass"]
    spread = simulate(w, ["compass"], jobs=200, hop_ms=12.0,
                      measured_hops=MeasuredHops.of([2.0, 4.0, 6.0, 36.0]))["policies"]["compass"]
    assert spread["breakdown_ms"]["hop_ms"] == pytest.approx(12.0, rel=0.15)  # the same mean
    assert spread["latency_ms"]["mean"] > constant["latency_ms"]["mean"] * 1.02


def test_each_draw_is_its_own_reproducible_stream_and_draw_zero_is_the_seeds_own():
    hops = MeasuredHops.of([1.0, 2.0, 3.0, 50.0])

    def first(measured: MeasuredHops) -> list[float]:
        draw = measured.sampler(7)
        return [draw() for _ in range(50)]
    streams = {k: first(replace(hops, draw=k)) for k in range(3)}
    assert streams[0] == first(hops)  # as before draws existed
    assert streams[1] == first(replace(hops, draw=1))
    assert len({tuple(s) for s in streams.values()}) == 3


def test_the_spread_over_draws_brackets_its_median_run():
    w = load_workload("dags/vision-fanout.json")
    measured = MeasuredHops.of([2.0, 4.0, 6.0, 60.0])
    spread = simulate_draws(w, ["compass", "jsq"], measured, 5, jobs=120, hop_ms=18.0)
    for name in ("compass", "jsq"):
        s = spread[name]
        means, loads = s["mean_ms"], s["loads_after_warmup"]
        assert s["draws"] == 5 and s["run"]["jobs"] == 120
        assert s["run"]["latency_ms"]["mean"] == means["median"]
        assert means["min"] <= means["median"] <= means["max"]
        assert means["min"] < means["max"]  # independent draws: different outcomes
        assert loads["min"] <= loads["median"] <= loads["max"]
    # the first draw is the single drawn simulation, unchanged
    one = simulate(w, ["compass"], jobs=120, hop_ms=18.0, measured_hops=measured)
    assert spread["compass"]["mean_ms"]["min"] <= one["policies"]["compass"]["latency_ms"][
        "mean"] <= spread["compass"]["mean_ms"]["max"]
    with pytest.raises(ValueError, match="draws must be at least 1"):
        simulate_draws(w, ["compass"], measured, 0, jobs=10)


def _latencies(measured: MeasuredHops | None) -> list[float]:
    w = load_workload("dags/caption-translate.json")  # chains of two and three nodes
    sim = Simulation(w, "compass", job_stream(w, rate=0.05, jobs=30),  # idle between jobs
                     SimOptions(measured_hops=measured))
    return [j.end - j.arrival for j in sim.run()]


def test_measured_sends_and_answers_delay_each_job_by_its_path_and_nothing_else():
    w = load_workload("dags/caption-translate.json")
    stream_nodes = [len(w.dags[name].nodes) for _, name in job_stream(w, rate=0.05, jobs=30)]
    assert MeasuredHops.of([3.0]).delays(1) is None  # none measured: none drawn
    base = _latencies(MeasuredHops.of([3.0]))
    sent = _latencies(MeasuredHops.of([3.0], releases_ms=[5.0]))
    answered = _latencies(MeasuredHops.of([3.0], answers_ms=[7.0]))
    # each node's send waits 5 ms after its input's end (a source's after its record)
    assert [round(s - b, 6) for s, b in zip(sent, base, strict=True)] == \
        [5.0 * n for n in stream_nodes]
    # the answer reaches its sender 7 ms after the last node's end; the cluster is unchanged
    assert [round(a - b, 6) for a, b in zip(answered, base, strict=True)] == [7.0] * 30


def test_delays_draw_from_their_own_stream_and_leave_the_hops_drawn_alone():
    plain = MeasuredHops.of([1.0, 2.0, 3.0, 50.0])
    delayed = MeasuredHops.of([1.0, 2.0, 3.0, 50.0], releases_ms=[1.0, 9.0, -4.0],
                              answers_ms=[2.0])
    a, b = plain.sampler(7), delayed.sampler(7)
    assert [a() for _ in range(40)] == [b() for _ in range(40)]
    pair = delayed.delays(7)
    assert pair is not None
    release, answer = pair
    assert {release() for _ in range(200)} == {0.0, 1.0, 9.0}  # floored at 0
    assert answer() == 2.0
