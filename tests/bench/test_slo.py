"""The benchmark's SLO accounting: refused, shed, late and met, without a cluster."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from compass_celery.bench.options import BenchOptions, planner_policy
from compass_celery.bench.runner import admission_on
from compass_celery.bench.slo import apply_record, expiring_dag, read_records, slo_table, submit
from compass_celery.errors import Rejected
from compass_celery.planner.admission import Slo
from compass_celery.results import (
    JobOutcome,
    TaskRun,
    batch_share_lines,
    left_capacity_share,
    overloaded_window,
    policy_result,
    window_batch_share,
)
from compass_celery.settings import resolve

INTERACTIVE = Slo("interactive", 400.0, "reject", "interactive")


class FakeDag:
    """Refuses or takes a job as told, recording what it was sent with."""

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.calls = refuse, []

    def apply_async(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        if self.refuse:
            raise Rejected("job 'search'", "predicted to finish in 900 ms", retry_after_s=0.5,
                           cause="deadline")
        return "handle"


def ticking(*times: float) -> Any:
    it = iter(times)
    return lambda: next(it)


def test_a_refusal_is_rejected_and_timed_around_the_call() -> None:
    dag, outcome = FakeDag(refuse=True), JobOutcome(0, "search", 0.0)
    assert submit(dag, outcome, INTERACTIVE, ticking(100.0, 101.5)) is None
    assert dag.calls == [{"slo": "interactive", "deadline_ms": 400.0}]
    assert outcome.rejected and not outcome.failed and outcome.refused_for == "deadline"
    assert (outcome.arrival_ms, outcome.end_ms) == (100.0, 101.5)
    assert (outcome.slo, outcome.deadline_ms) == ("interactive", 400.0)


def test_an_admitted_job_returns_its_handle_and_a_job_without_slo_sends_none() -> None:
    dag, outcome = FakeDag(refuse=False), JobOutcome(0, "search", 0.0)
    assert submit(dag, outcome, None, ticking(5.0)) == "handle"
    assert dag.calls == [{}] and outcome.slo == "" and outcome.end_ms is None


def error(exc_type: str) -> bytes:
    return json.dumps({"exc_type": exc_type, "node": "caption"}).encode()


def test_deadline_missed_is_shed_not_failed_and_late_is_read() -> None:
    shed = JobOutcome(0, "a", 0.0, end_ms=300.0, failed=True, slo="interactive")
    apply_record(shed, error("DeadlineMissed"), b"0")
    assert shed.shed and not shed.failed and not shed.late

    broken = JobOutcome(1, "a", 0.0, end_ms=300.0, failed=True, slo="interactive")
    apply_record(broken, error("ValueError"), None)
    assert broken.failed and not broken.shed

    late = JobOutcome(2, "a", 0.0, end_ms=900.0, slo="interactive", deadline_ms=400.0)
    apply_record(late, None, b"1")
    assert late.late and late.completed and not late.met


class FakePipe:
    def __init__(self, records: dict[str, tuple[Any, Any]]) -> None:
        self.records, self.asked = records, []

    def hmget(self, key: str, fields: list[str]) -> None:
        assert fields == ["error", "late"]
        self.asked.append(key)

    def execute(self) -> list[tuple[Any, Any]]:
        return [self.records[k] for k in self.asked]


def test_read_records_folds_every_ended_job_in_one_pipeline() -> None:
    pipe = FakePipe({"j0": (error("DeadlineMissed"), b"0"), "j1": (None, b"1")})
    client = SimpleNamespace(pipeline=lambda transaction: pipe)
    handles = [
        (JobOutcome(0, "a", 0.0, end_ms=10.0, failed=True, slo="interactive"),
         SimpleNamespace(client=client, keys=SimpleNamespace(job="j0"))),
        (JobOutcome(1, "a", 0.0, end_ms=10.0, slo="interactive"),
         SimpleNamespace(client=client, keys=SimpleNamespace(job="j1"))),
        (JobOutcome(2, "a", 0.0, slo="interactive"),  # still running: not read
         SimpleNamespace(client=client, keys=SimpleNamespace(job="j2"))),
    ]
    read_records(handles)
    assert pipe.asked == ["j0", "j1"]
    assert handles[0][0].shed and handles[1][0].late


def test_refused_and_shed_jobs_are_neither_failed_nor_lost() -> None:
    jobs = [JobOutcome(0, "a", 0.0, end_ms=200.0, slo="interactive", deadline_ms=400.0),
            JobOutcome(1, "a", 10.0, end_ms=11.0, slo="interactive", deadline_ms=400.0,
                       rejected=True),
            JobOutcome(2, "a", 20.0, end_ms=300.0, slo="interactive", deadline_ms=400.0,
                       shed=True),
            JobOutcome(3, "a", 30.0, end_ms=900.0, slo="interactive", deadline_ms=400.0)]
    r = policy_result(jobs, 0.0, 0, 0, 0)
    assert (r["completed"], r["failed"], r["lost"]) == (2, 0, 0)
    s = r["slo"]["interactive"]
    assert (s["admitted"], s["rejected"], s["shed"], s["met"]) == (3, 1, 1, 1)
    assert s["rejection_ms"]["p99"] == pytest.approx(1.0)
    table = slo_table({"policies": {"compass": {**r, "loads_per_job": 0.5}}})
    assert "compass" in table and "interactive" in table and "all" not in table


class FakeBaseDag:
    def __init__(self, name: str) -> None:
        self.name = name
        settings = resolve({"compass_time_scale": 0.5})
        self.app = SimpleNamespace(compass=SimpleNamespace(settings=settings))

    def records(self, spec: Any, priority: Any = None) -> dict[str, dict[str, Any]]:
        return {"detect": {"preds": []}, "caption": {"preds": ["detect"]}}


def test_celery_expires_nodes_expire_at_arrival_plus_deadline(monkeypatch) -> None:
    monkeypatch.setattr("compass_celery.bench.slo.time.time", lambda: 1000.0)
    cls = expiring_dag(FakeBaseDag, {"search": 400.0}.get)
    nodes = cls("search").records(None)
    # 400 workload ms at time scale 0.5 is 0.2 real s; no tail: expires at the due time
    assert all(n["due"] == pytest.approx(1000.2) and n["tail_ms"] == 0.0
               for n in nodes.values())
    assert "due" not in cls("batch").records(None)["detect"]  # no deadline: no expiry


def test_celery_baselines_run_plain_celery_without_admission() -> None:
    assert planner_policy("celery-expires") == "celery-default"
    assert planner_policy("compass") == "compass"
    on, off = BenchOptions(), BenchOptions(admission=False)
    assert admission_on(on, "compass") and not admission_on(off, "compass")
    assert not admission_on(on, "celery-expires") and not admission_on(on, "celery-default")


def test_bench_command_takes_the_variant_and_the_admission_flag() -> None:
    from click.testing import CliRunner

    from compass_celery import workloads
    from compass_celery.cli import compass_command

    result = CliRunner().invoke(compass_command, [
        "bench", "--workload", str(workloads.path("bursty-mixed.json")), "--policies",
        "compass,celery-expires", "--admission", "off", "--headroom", "0.1", "--redis", "redis://127.0.0.1:1/0"])
    assert result.exit_code != 0 and "cannot reach Redis" in result.output  # flags parsed


def test_markdown_tables_one_per_rate_with_extra_runs(tmp_path) -> None:
    from compass_celery.bench.slo import markdown_tables

    jobs = [JobOutcome(0, "a", 0.0, end_ms=200.0, slo="interactive", deadline_ms=400.0),
            JobOutcome(1, "a", 10.0, end_ms=12.0, slo="interactive", deadline_ms=400.0,
                       rejected=True)]
    r = {**policy_result(jobs, 0.0, 0, 0, 0), "loads_per_job": 0.25}
    for name, policies in [("ev-16-on", {"compass": r, "celery-expires": r}),
                           ("ev-16-off", {"compass": r}), ("again-ev-16-on", {"compass": r})]:
        (tmp_path / f"{name}.json").write_text(json.dumps({"policies": policies}))
    text = markdown_tables(str(tmp_path), stem="ev")
    assert "16 jobs/s" in text and "| compass, admission off | 1 | 1 |" in text
    assert "| compass, admission on (again) | 1 | 1 | 0 | 50.0% | 100.0% |" in text
    assert "celery-default + `expires=` deadline" in text and "| 2.00 |" in text


def test_every_job_is_in_the_json_with_its_outcome():
    from compass_celery.results import JobOutcome, job_records

    jobs = [JobOutcome(0, "a", 0.0, 100.0, slo="interactive", deadline_ms=400.0),
            JobOutcome(1, "a", 10.0, 600.0, slo="interactive", deadline_ms=400.0),
            JobOutcome(2, "a", 20.0, 21.0, slo="interactive", deadline_ms=400.0,
                       rejected=True),
            JobOutcome(3, "a", 30.0, 90.0, slo="interactive", deadline_ms=400.0, shed=True),
            JobOutcome(4, "b", 40.0, None)]
    rows = job_records(jobs)
    assert [r["outcome"] for r in rows] == ["met", "late", "rejected", "shed", "lost"]
    assert rows[0]["latency_ms"] == 100.0 and rows[2]["latency_ms"] is None


def test_left_capacity_share_counts_batch_work_against_what_interactive_leaves() -> None:
    """2 GPUs over a 1,000 ms span leave 2,000 ms; a met interactive job of 400 ms takes
    that to 1,600; two batch jobs of 600 ms answered use 1,200 of it: 75%. A late
    interactive job leaves its time to batch, and an unanswered batch job counts nothing."""
    jobs = [JobOutcome(0, "qa", 0.0, 300.0, slo="interactive", deadline_ms=500.0),
            JobOutcome(1, "qa", 100.0, 900.0, slo="interactive", deadline_ms=500.0),
            JobOutcome(2, "tr", 0.0, 800.0, slo="batch"),
            JobOutcome(3, "tr", 200.0, 1000.0, slo="batch"),
            JobOutcome(4, "tr", 300.0, None, slo="batch")]
    share = left_capacity_share(jobs, {"qa": 400.0, "tr": 600.0}, gpus=2)
    assert share == {"span_ms": 1000.0, "left_ms": 1600.0, "done_ms": 1200.0, "share": 0.75}


def test_left_capacity_share_needs_both_kinds_of_work() -> None:
    only_batch = [JobOutcome(0, "tr", 0.0, 800.0, slo="batch")]
    only_interactive = [JobOutcome(0, "qa", 0.0, 300.0, slo="i", deadline_ms=500.0)]
    assert left_capacity_share(only_batch, {"tr": 600.0}, gpus=1) is None
    assert left_capacity_share(only_interactive, {"qa": 600.0}, gpus=1) is None


def test_window_share_counts_task_runs_inside_the_overloaded_window_only() -> None:
    """The window runs from the first arrival (0) to the last (1,000): 2 GPUs give 2,000
    ms, an interactive run of 400 ms inside it leaves 1,600; batch runs inside it count
    1,000 + 200 (the part of one crossing the end), a batch run after it nothing, so
    the tail where the last steps run alone does not count: 1,200 / 1,600."""
    jobs = [JobOutcome(0, "tr", 0.0, 1500.0, slo="batch"),
            JobOutcome(1, "qa", 100.0, 600.0, slo="interactive", deadline_ms=800.0),
            JobOutcome(2, "tr", 1000.0, 2500.0, slo="batch")]
    runs = [TaskRun(0.0, 1000.0, True), TaskRun(800.0, 1100.0, True),
            TaskRun(2000.0, 2500.0, True), TaskRun(150.0, 550.0, False)]
    share = window_batch_share(jobs, runs, gpus=2)
    assert share == {"window_ms": 1000.0, "ends": "last_arrival", "left_ms": 1600.0,
                     "done_ms": 1200.0, "share": 0.75}
    assert "window 75.0% (1.0 s, to the last arrival)" in batch_share_lines(
        {"policies": {"compass": {"batch_share_window": share}}})


def test_window_ends_when_the_batch_backlog_first_empties() -> None:
    """Batch job 0 ends at 400 before batch job 2 arrives (600): the backlog is empty at
    400, which ends the window; a refused batch job never enters it, and a job ending
    as another arrives leaves it taken."""
    jobs = [JobOutcome(0, "tr", 0.0, 400.0, slo="batch"),
            JobOutcome(1, "tr", 100.0, 100.0, slo="batch", rejected=True),
            JobOutcome(2, "tr", 600.0, 900.0, slo="batch"),
            JobOutcome(3, "qa", 1000.0, 1200.0, slo="i", deadline_ms=500.0)]
    assert overloaded_window(jobs) == (0.0, 400.0, "backlog_empty")
    jobs[2].arrival_ms, jobs[2].end_ms = 400.0, 1100.0
    assert overloaded_window(jobs) == (0.0, 1000.0, "last_arrival")


def test_window_share_needs_both_kinds_of_work() -> None:
    only_batch = [JobOutcome(0, "tr", 0.0, 800.0), JobOutcome(1, "tr", 10.0, 900.0)]
    assert window_batch_share(only_batch, [TaskRun(0.0, 800.0, True)], gpus=1) is None
