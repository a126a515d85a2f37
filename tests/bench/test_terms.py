"""Predicted against measured: the rows, the statistics, and the measured workload."""

from __future__ import annotations

import math
import statistics

import pytest

from compass_celery.bench.measured import measured_workload, medians
from compass_celery.bench.terms import job_rows, node_rows, term_errors
from compass_celery.workload import load_workload

PLAN = {"a": {"worker": "w0", "start_ms": 0.0, "finish_ms": 110.0, "load_ms": 100.0,
              "run_ms": 10.0},
        "b": {"worker": "w1", "start_ms": 110.0, "finish_ms": 140.0, "load_ms": 0.0,
              "run_ms": 30.0},
        "c": {"worker": "w1", "start_ms": 140.0, "finish_ms": 150.0, "load_ms": 0.0,
              "run_ms": 10.0}}
NODES = {"a": {"model": "m", "preds": []}, "b": {"model": "n", "preds": ["a"]},
         "c": {"model": "n", "preds": ["b"]}}
INFO = {"a": {"worker": "w0", "queued_ms": 5.0, "load_ms": 200.0, "run_ms": 12.0,
              "finished": 100.25},
        "b": {"worker": "w1", "queued_ms": 40.0, "load_ms": 0.0, "run_ms": 30.0,
              "finished": 100.30},
        "c": {"worker": "w0", "queued_ms": 0.0, "load_ms": 0.0, "run_ms": 9.0,
              "finished": 100.31}}  # moved at re-placement: no row


def test_rows_pair_each_term_and_skip_moved_nodes():
    rows = node_rows(PLAN, INFO, 100.0, NODES)
    assert [r["node"] for r in rows] == ["a", "b"]
    a, b = rows
    assert (a["pred_load"], a["meas_load"]) == (100.0, 200.0)
    assert a["meas_finish"] == pytest.approx(250.0)
    assert b["pred_wait"] == 0.0  # planned to start as its input was ready
    assert b["meas_wait"] == 40.0 and b["model"] == "n"


def test_errors_per_term_and_per_job():
    rows = node_rows(PLAN, INFO, 100.0, NODES)
    errs = term_errors(rows)
    assert errs["load"]["n"] == 1  # only the node that loaded
    assert errs["load"]["abs_err_median_ms"] == 100.0
    assert errs["load"]["rel_err_median"] == pytest.approx(0.5)
    assert errs["run"]["n"] == 2
    assert "load" not in term_errors([r for r in rows if r["node"] == "b"])  # none loaded
    idle = term_errors([{**r, "pred_wait": 0.0, "meas_wait": 0.2} for r in rows])
    assert math.isnan(idle["wait"]["rel_err_median"])  # near-zeros: reported in ms only
    jobs = job_rows([(150.0, 300.0), (100.0, 100.0)])
    assert jobs["n"] == 2 and jobs["bias_median_ms"] == pytest.approx(75.0)


def test_the_simulator_is_fed_what_was_measured():
    w = load_workload("dags/voice-real.json")
    rows = [{"model": "minilm-a", "meas_run": 20.0, "meas_load": 250.0},
            {"model": "minilm-a", "meas_run": 40.0, "meas_load": 0.0},
            {"model": "silero-vad", "meas_run": 150.0, "meas_load": 0.0}]
    assert medians(rows, "run") == {"minilm-a": 30.0, "silero-vad": 150.0}
    fed = measured_workload(w, rows)
    node = fed.dags["search-a"].nodes
    assert node["query"].exec_ms == 30.0 and node["speech"].exec_ms == 150.0
    assert node["rank"].exec_ms == w.dags["search-a"].nodes["rank"].exec_ms  # no model
    # 90.861 MB loaded in 250 ms: the simulator's workers load at 363 MB/s
    assert fed.cluster.workers[0].load_mb_per_s == pytest.approx(363.4, abs=0.1)


def test_the_hop_is_the_gap_a_busy_worker_pays_between_tasks():
    from compass_celery.bench.terms import hop_gaps, hop_ms

    job1 = {"a": {"worker": "w0", "sent": 0.0, "started": 0.0, "finished": 0.100},
            "b": {"worker": "w0", "sent": 0.05, "started": 0.120, "finished": 0.200}}
    job2 = {"c": {"worker": "w0", "sent": 0.15, "started": 0.230, "finished": 0.300},
            # it arrived after w0 went idle: its wait is not a hop
            "d": {"worker": "w0", "sent": 0.9, "started": 0.905, "finished": 1.0},
            "e": {"worker": "w1", "sent": 0.0, "started": 0.0}}  # unfinished: ignored
    assert hop_ms([job1, job2]) == pytest.approx(25.0)  # gaps of 20 and 30 ms
    assert hop_ms([job1, job2], time_scale=0.5) == pytest.approx(50.0)
    assert hop_ms([{"x": job2["d"]}]) is None
    job3 = {"f": {"worker": "w0", "sent": 0.95, "started": 1.09, "finished": 1.2}}
    # gaps of 20, 30 and 90 ms: the mean is the busy time they took, the median hides it
    assert hop_ms([job1, job2, job3]) == pytest.approx(30.0)
    assert hop_ms([job1, job2, job3], stat=statistics.fmean) == pytest.approx(46.67)
    # every gap, for the spread the mean hides (the benchmark's JSON keeps them)
    assert sorted(hop_gaps([job1, job2, job3])) == pytest.approx([20.0, 30.0, 90.0])
    assert hop_gaps([{"x": job2["d"]}]) == []


def test_the_simulator_is_fed_the_per_task_cost_the_workers_paid():
    from compass_celery.bench.terms import run_overshoot_ms, startup_ms
    from compass_celery.cli.compare import per_task_cost

    # three tasks on a resident model (a start-up of 1 to 2 ms before the run), one load
    rows = [{"pred_run": 20.0, "meas_run": m, "pred_load": 0.0, "meas_load": up}
            for m, up in ((22.0, 1.0), (23.0, 1.5), (30.0, 2.0))]
    rows.append({"pred_run": 20.0, "meas_run": 24.0, "pred_load": 400.0, "meas_load": 450.0})
    assert run_overshoot_ms(rows) == 3.5 and run_overshoot_ms([]) == 0.0
    assert startup_ms(rows) == 1.5 and startup_ms([]) == 0.0  # the load is left out
    result = {"policies": {"compass": {"hop_ms": 8.0, "hop_mean_ms": 10.0,
                                       "prediction_rows": rows}}}
    # no hops kept: the constant only
    assert per_task_cost(result, real=False) == (
        15.0, "mean hop 10 ms + start-up 1.5 ms + run overshoot 3.5 ms", None)
    # real compute: the simulator already runs the measured run times
    assert per_task_cost(result, real=True)[:2] == (11.5, "mean hop 10 ms + start-up 1.5 ms")
    assert per_task_cost({"policies": {"p": {}}}, real=False) == (0.0, "", None)
    # the hops kept: drawn task by task, each with one task's start-up and overshoot
    result["policies"]["compass"]["hop_gaps_ms"] = [4.0, 6.0, 20.0]
    _, _, measured = per_task_cost(result, real=False)
    assert measured.hops_ms == (4.0, 6.0, 20.0)
    assert measured.overshoots_ms == (3.0, 4.5, 12.0, 4.0)
    assert per_task_cost(result, real=True)[2].overshoots_ms == (1.0, 1.5, 2.0, 0.0)


def test_a_predicted_load_a_prefetch_already_did_is_told_apart():
    from compass_celery.bench.terms import load_outcomes

    rows = [{"pred_load": 500.0, "meas_load": 600.0}, {"pred_load": 500.0, "meas_load": 0.5},
            {"pred_load": 0.0, "meas_load": 700.0}, {"pred_load": 0.0, "meas_load": 0.4}]
    out = load_outcomes(rows)
    assert (out["predicted_and_waited_for"], out["done_by_prefetch_first"],
            out["unpredicted"]) == (1, 1, 1)
    assert out["when_waited_for"]["abs_err_median_ms"] == 100.0
    full = {f"{w}_{t}": 1.0 for w in ("pred", "meas") for t in ("wait", "run", "finish")}
    errs = term_errors([{**full, **rows[0]}])
    assert errs["load"]["abs_err_over_meas"] == pytest.approx(100 / 600, abs=1e-3)


def test_a_load_planned_as_a_prefetch_counts_as_planned_and_is_checked():
    from compass_celery.bench.terms import load_outcomes

    rows = [{"pred_load": 0.0, "pred_prefetch": 500.0, "meas_load": 0.5},   # hidden, as planned
            {"pred_load": 200.0, "pred_prefetch": 300.0, "meas_load": 240.0},  # rest waited
            {"pred_load": 0.0, "pred_prefetch": 450.0, "meas_load": 400.0}]   # not hidden
    out = load_outcomes(rows)
    assert out["unpredicted"] == 0  # a planned prefetch is a predicted load
    assert (out["planned_as_prefetch"], out["planned_as_prefetch_and_hidden"]) == (3, 1)
    assert (out["predicted_and_waited_for"], out["done_by_prefetch_first"]) == (2, 1)
    assert node_rows({"a": {**PLAN["a"], "prefetch_ms": 60.0}}, INFO, 100.0,
                     NODES)[0]["pred_prefetch"] == 60.0


def _row(node: str, finish: float, run: float, load: float, wait: float,
         **extra: object) -> dict[str, object]:
    return {"node": node, "meas_finish": finish, "meas_run": run, "meas_load": load,
            "meas_wait": wait, **extra}


PREDS = {"chain": {"a": [], "b": ["a"]}, "join": {"x": [], "y": [], "z": ["x", "y"]}}


def test_release_delays_read_each_send_and_answer_off_the_rows():
    from compass_celery.bench.terms import release_delays

    jobs = [{"i": 3, "dag": "chain", "latency_ms": 60.0},
            {"i": 4, "dag": "join", "latency_ms": 100.0}]
    rows = [_row("a", 20.0, 10.0, 1.0, 6.0),   # sent 3.0 after the record
            _row("b", 50.0, 20.0, 1.0, 5.0),   # sent 24.0: 4.0 after a's end
            _row("x", 30.0, 25.0, 0.0, 3.0),   # sent 2.0
            _row("y", 90.0, 80.0, 0.0, 8.0),   # sent 2.0
            _row("z", 96.0, 3.0, 0.5, 0.0)]    # sent 92.5: 2.5 after y, the later input
    releases, answers = release_delays(rows, jobs, PREDS)
    assert releases == pytest.approx([3.0, 4.0, 2.0, 2.0, 2.5])
    assert answers == pytest.approx([10.0, 4.0])  # latency less the last node's end
    # the same with each row's job index, in any order
    tagged = [{**r, "job": 3 if r["node"] in "ab" else 4} for r in rows]
    again = release_delays(tagged[::-1], jobs, PREDS)
    assert sorted(again[0]) == pytest.approx([2.0, 2.0, 2.5, 3.0, 4.0])
    assert again[1] == pytest.approx([10.0, 4.0])


def test_release_delays_skip_what_they_cannot_read():
    from compass_celery.bench.terms import release_delays

    jobs = [{"i": 0, "dag": "chain", "latency_ms": 60.0},
            {"i": 1, "dag": "chain", "latency_ms": 50.0}]
    # job 0's source moved (no row): its successor's release cannot be read, nor its
    # answer; job 1's successor overlaps its input's end (a re-delivery): left out
    rows = [_row("b", 50.0, 20.0, 1.0, 5.0),
            _row("a", 20.0, 10.0, 1.0, 6.0), _row("b", 40.0, 20.0, 1.0, 5.0)]
    releases, answers = release_delays(rows, jobs, PREDS)
    assert releases == pytest.approx([3.0])
    assert answers == pytest.approx([10.0])
    with pytest.raises(ValueError, match="left over"):  # rows of a job not given
        release_delays(rows + [_row("x", 1.0, 1.0, 0.0, 0.0)], jobs, PREDS)
