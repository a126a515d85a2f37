"""The many-model workload generator: seeded, valid, at the utilisation it was asked for."""

from __future__ import annotations

from compass_celery.sim.generate import CLUSTER, generate, work_per_job_ms
from compass_celery.workload import parse_workload


def test_a_generated_workload_parses_and_runs_at_the_asked_load() -> None:
    obj = generate(3, models=9, workflows=4, load=0.8)
    wl = parse_workload(obj)
    assert len(wl.dags) == 4 and len(wl.models) == 9
    busy = wl.arrivals.rate_per_s * work_per_job_ms(obj["dags"], obj["mix"])
    assert abs(busy / (1000.0 * CLUSTER["workers"]) - 0.8) < 0.01


def test_the_same_seed_gives_the_same_workload() -> None:
    assert generate(5) == generate(5)
    assert generate(5) != generate(6)
