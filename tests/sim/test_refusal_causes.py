"""Refusals by SLO class and cause in the simulator's results: the counts add up to the
refusals, and the SLO table shows them."""

from __future__ import annotations

from pathlib import Path

from compass_celery.planner.admission import REFUSAL_CAUSES
from compass_celery.results import JobOutcome, refused_for, slo_result, slo_table
from compass_celery.sim.runner import simulate
from compass_celery.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


def test_each_class_counts_its_refusals_by_cause() -> None:
    w = load_workload(ROOT / "dags" / "navigator-mixed.json")
    # jsq places by backlog alone, so past capacity it refuses, mostly for cold models
    result = simulate(w, ["jsq"], rate=8.0, jobs=300)
    slo = result["policies"]["jsq"]["slo"]
    seen = set()
    for cls, c in slo.items():
        assert sum(c["refused_for"].values()) == c["rejected"], (cls, c)
        seen |= set(c["refused_for"])
    assert slo["interactive"]["rejected"] > 0 and slo["batch"]["rejected"] == 0
    assert seen and seen <= set(REFUSAL_CAUSES)
    table = slo_table(result)
    assert "refused for" in table.splitlines()[0]
    row = next(line for line in table.splitlines() if " interactive " in line)
    assert any(f"{cause} " in row for cause in seen)


def test_refused_for_counts_and_cell() -> None:
    jobs = [JobOutcome(i, "d", float(i), float(i), slo="click", deadline_ms=100.0,
                       rejected=True, refused_for=cause)
            for i, cause in enumerate(["cold", "deadline", "cold", ""])]
    jobs.append(JobOutcome(4, "d", 4.0, 50.0, slo="click", deadline_ms=100.0))
    c = slo_result(jobs, 0.0)["slo"]["click"]
    assert c["rejected"] == 4 and c["refused_for"] == {"cold": 2, "deadline": 1}
    assert refused_for(c["refused_for"]) == "cold 2, deadline 1" and refused_for({}) == "-"


def test_the_slo_table_counts_what_admitted_jobs_missed_apart_from_taken_late() -> None:
    """'taken late' is a verdict at admission; 'missed' is what admitted jobs did not meet,
    shed or answered after the deadline, so a reader need not add columns that count
    different things."""
    jobs = [JobOutcome(0, "d", 0.0, 50.0, slo="click", deadline_ms=100.0),  # met
            JobOutcome(1, "d", 0.0, 150.0, slo="click", deadline_ms=100.0),  # answered late
            JobOutcome(2, "d", 0.0, 60.0, slo="click", deadline_ms=100.0, shed=True),
            JobOutcome(3, "d", 0.0, 120.0, slo="click", deadline_ms=100.0, late=True),
            JobOutcome(4, "d", 0.0, 1.0, slo="click", deadline_ms=100.0, rejected=True)]
    c = slo_result(jobs, 0.0)["slo"]["click"]
    assert (c["admitted"], c["met"], c["shed"], c["late"]) == (4, 1, 1, 1)
    lines = slo_table({"policies": {"compass": {"slo": {"click": c}}}}).splitlines()
    header, row = lines[0].split(), lines[-1].split()
    assert "taken" in header and "missed" in header
    # policy slo jobs admitted rejected refused-for shed taken-late missed attain ...
    assert row[:9] == ["compass", "click", "5", "4", "1", "-", "1", "1", "3"]
