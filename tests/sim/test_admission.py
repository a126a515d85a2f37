"""The simulator's admission and shedding: the real submit's and worker's rules, through
the very same functions (``planner.admission``), on a simulated cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass_celery.planner import admission
from compass_celery.planner.admission import DEFAULT_HEADROOM
from compass_celery.planner.types import SHARED
from compass_celery.sim import Simulation, simulate
from compass_celery.sim import cluster as sim_cluster
from compass_celery.sim import runner as sim_runner
from compass_celery.sim.cluster import SimCluster, SimTask
from compass_celery.sim.engine import Engine
from compass_celery.workload import job_stream, parse_workload

ROOT = Path(__file__).resolve().parents[2]
ONE = {"nodes": {"a": {"model": "m", "exec_ms": 30}}}
FAN = {"nodes": {"a": {"model": "m", "exec_ms": 20}, "b": {"model": "m", "exec_ms": 30},
                 "c": {"model": "m", "exec_ms": 30}},
       "edges": [["a", "b"], ["a", "c"]]}


def raw_workload(dags=None, *, rate=66.0, workers=1, jobs=400, on_miss="reject",
                 deadline_ms=300.0, slo_dags=None):
    """One 150 MB model; 30 ms single-task jobs on one worker by default: 33 jobs/s of
    capacity, so 66/s is twice it. Every template is in class ``fast`` unless
    ``slo_dags`` says which are."""
    dags = dags or {"one": ONE}
    return {
        "name": "slo", "models": {"m": 150}, "dags": dags,
        "cluster": {"workers": workers, "gpu_mem_mb": 1000, "load_mb_per_s": 1500,
                    "net_mb_per_s": 1000},
        "arrivals": {"process": "poisson", "rate_per_s": rate, "jobs": jobs, "seed": 3},
        "slo": {"classes": {"fast": {"deadline_ms": deadline_ms, "on_miss": on_miss}},
                "dags": {d: "fast" for d in (slo_dags if slo_dags is not None else dags)}},
    }


def slo_workload(dags=None, **kw):
    """:func:`raw_workload`, parsed."""
    return parse_workload(raw_workload(dags, **kw))


def run(w, *, admission_on=True, max_queue_ms=None, policy="compass", hop_ms=0.0):
    """The finished Simulation (jobs, cluster counters) and its result record; ``hop_ms``
    is per-task work the plans do not count (``plan_hop`` off), so jobs taken as on time
    fall behind."""
    stream = job_stream(w)
    sim = Simulation(w, policy, stream, admission=admission_on, max_queue_ms=max_queue_ms,
                     hop_ms=hop_ms, plan_hop=False)
    sim.run()
    record = simulate(w, [policy], admission=admission_on, max_queue_ms=max_queue_ms,
                      hop_ms=hop_ms, plan_hop=False)["policies"][policy]
    return sim, record


def test_admission_at_twice_capacity_rejects_some_and_admitted_jobs_meet_deadline():
    _, r = run(slo_workload())
    s = r["slo"]["fast"]
    assert s["rejected"] > 0.3 * s["jobs"]
    assert s["admitted_attainment"] >= 0.95
    assert r["lost"] == r["failed"] == 0


def test_admission_on_four_workers_too():
    _, r = run(slo_workload(rate=266.0, workers=4))
    s = r["slo"]["fast"]
    assert s["rejected"] > 0.3 * s["jobs"] and s["admitted_attainment"] >= 0.95


def test_without_admission_or_shedding_attainment_collapses():
    """on_miss='late': every job is taken and run to the end, so the queue grows and
    almost nothing meets its deadline; with admission, half the jobs do."""
    _, late = run(slo_workload(on_miss="late"))
    _, judged = run(slo_workload())
    assert late["slo"]["fast"]["attainment"] < 0.1
    assert late["slo"]["fast"]["late"] > 0.5 * late["slo"]["fast"]["jobs"]
    assert late["tasks"]["run"] == 400 and late["slo"]["fast"]["shed"] == 0
    assert judged["slo"]["fast"]["attainment"] > 4 * late["slo"]["fast"]["attainment"]


def test_admission_off_takes_every_job_and_runs_the_late_ones_to_the_end():
    """Off, nothing is refused; a job taken although its plan misses is marked late and
    never shed (dropping it would only waste what it already cost)."""
    sim, r = run(slo_workload(), admission_on=False)
    s = r["slo"]["fast"]
    assert s["rejected"] == 0 and s["admitted"] == s["jobs"] and s["late"] > 0
    late = [j for j in sim.jobs if j.late]
    assert late and not any(j.shed for j in late)


def test_admission_off_multi_task_jobs_lose_attainment():
    """Fan-out jobs taken regardless of their plan waste capacity on nodes whose job is
    shed later; admission keeps far more of them on time."""
    w = slo_workload({"fan": FAN}, rate=40.0, deadline_ms=250.0)
    _, on = run(w)
    _, off = run(w, admission_on=False)
    assert off["slo"]["fast"]["attainment"] < on["slo"]["fast"]["attainment"]
    assert off["tasks"]["run"] > on["tasks"]["run"] * 0.9  # it spent as much, for less


def test_shedding_drops_tasks_before_they_run():
    sim, r = run(slo_workload(), hop_ms=40.0)
    dropped = [t for j in sim.jobs for t in j.tasks if t.dropped]
    assert dropped and all(t.start_at < 0 for t in dropped)
    ran = sum(t.start_at >= 0 for j in sim.jobs for t in j.tasks)
    assert ran == sim.cluster.started == r["tasks"]["run"]
    taken = sum(not j.rejected for j in sim.jobs)
    assert ran + sim.cluster.dropped == taken  # each single-task job taken ran or was dropped
    assert r["tasks"]["run"] < taken
    # nothing started past its latest start (the deadline less its tail)
    for j in sim.jobs:
        for t in j.tasks:
            if t.start_at >= 0:
                assert t.start_at <= j.due - j.tails[t.node] + 1e-6


def test_a_shed_job_has_its_queued_tasks_revoked_and_nothing_runs_after():
    sim, r = run(slo_workload({"fan": FAN}), hop_ms=40.0)
    shed = [j for j in sim.jobs if j.shed]
    assert shed and sim.cluster.revoked + sim.cluster.withheld > 0
    for j in shed:
        assert j.end is not None and not j.pending
        for t in j.tasks:
            assert t.start_at < 0 or t.start_at <= j.end  # nothing started once shed
    assert r["tasks"]["revoked"] == sim.cluster.revoked
    assert all(not w.queue for w in sim.cluster.workers)  # nothing left behind
    assert all(abs(w.backlog_ms) < 1e-6 and abs(w.pending_ms) < 1e-6
               for w in sim.cluster.workers)


def test_successors_released_too_late_are_withheld_and_the_job_shed():
    """A per-task hop the plan does not know makes nodes run longer than planned, so a
    finishing node can release successors that could no longer meet the deadline: the job
    is shed there (the runtime's ``_too_late``) and they are never sent."""
    chain = {"nodes": {"a": {"model": "m", "exec_ms": 20}, "b": {"model": "m", "exec_ms": 30}},
             "edges": [["a", "b"]]}
    w = slo_workload({"ab": chain}, rate=40.0, deadline_ms=250.0)
    sim = Simulation(w, "compass", job_stream(w), hop_ms=40.0, plan_hop=False)
    sim.run()
    assert sim.cluster.withheld > 0
    withheld = [j for j in sim.jobs if j.shed and "a" in j.finish and
                not any(t.node == "b" for t in j.tasks)]
    assert len(withheld) == sim.cluster.withheld  # shed at release: b never sent
    for j in withheld:
        assert j.end == j.finish["a"]
        assert admission.should_shed(j.end / 1000, j.due / 1000, j.tails["b"])


def test_celery_default_is_never_refused_nor_shed():
    """celery-default plans nothing (shared queue: no prediction), so it is never
    refused or shed, and it meets no deadline at twice capacity."""
    _, r = run(slo_workload(), policy="celery-default")
    s = r["slo"]["fast"]
    assert s["rejected"] == s["shed"] == 0 and r["completed"] == 400
    assert s["attainment"] < 0.1


def test_celery_expires_drops_tasks_unstarted_by_the_deadline_and_refuses_none():
    """celery-expires is celery-default with Celery's ``expires=`` at each job's arrival
    plus its deadline: nothing refused, every task not started by then dropped unrun (its
    job shed), every task that starts in time run; at twice capacity most are dropped,
    and no answered job ends later than its deadline plus one task."""
    sim, r = run(slo_workload(), policy="celery-expires")
    s = r["slo"]["fast"]
    assert s["rejected"] == 0 and s["shed"] > 0.3 * s["jobs"]
    for j in sim.jobs:
        if j.shed:
            assert j.end >= j.due  # dropped only once its deadline had passed
        elif j.end is not None:
            assert j.end <= j.due + 30.0 + 1e-6  # started by the deadline, one 30 ms run


def test_shared_queue_drop_and_revoke_leave_the_worker_idle_once():
    """A worker that takes an expired task from the shared queue drops it; the job's
    other task is revoked from the shared queue; the worker is listed idle once and
    takes the next task."""
    engine = Engine()
    done, shed = [], []

    def on_shed(task, worker):
        shed.append(task)
        cluster.revoke([t2, t3])

    specs = slo_workload().cluster.workers
    cluster = SimCluster(specs, engine, {"m": 150.0}, shared=True,
                         on_done=lambda t, w: done.append(t), on_failed=on_shed,
                         on_shed=on_shed)
    t1 = SimTask(None, "a", "m", 30.0)
    t2 = SimTask("J", "b", "m", 30.0, due_s=0.05, tail_ms=30.0)  # latest start: 20 ms
    t3 = SimTask("J", "c", "m", 30.0, due_s=0.05, tail_ms=30.0)
    for t in (t1, t2, t3):
        cluster.send(t, SHARED)
    engine.run()
    (worker,) = cluster.workers
    assert done == [t1] and shed == [t2] and t2.dropped and t3.dropped
    assert (cluster.started, cluster.dropped, cluster.revoked) == (1, 1, 1)
    assert not cluster.shared_queue and list(cluster.idle) == [worker] and worker.listed_idle
    assert worker.backlog_ms == 0 and not worker.queued_models
    t4 = SimTask(None, "d", "m", 30.0)
    cluster.send(t4, SHARED)
    engine.run()
    assert done == [t1, t4] and list(cluster.idle) == [worker]


def test_a_job_without_slo_is_unaffected():
    """No slo section: identical results with admission on or off, and no SLO keys."""
    plain = parse_workload({**raw_workload(), "slo": {}})
    on = simulate(plain, ["compass", "celery-default"], admission=True)
    off = simulate(plain, ["compass", "celery-default"], admission=False)
    strip = lambda res: {p: {k: v for k, v in r.items() if k != "plan_ms"}  # noqa: E731
                         for p, r in res["policies"].items()}
    assert strip(on) == strip(off)
    assert all("slo" not in r and "tasks" not in r for r in on["policies"].values())


def test_templates_without_slo_are_never_refused_nor_shed():
    w = slo_workload({"one": ONE, "two": {"nodes": {"x": {"model": "m", "exec_ms": 30}}}},
                     slo_dags=["one"])
    sim, r = run(w, admission_on=True)
    free = [j for j in sim.jobs if j.dag.name == "two"]
    assert free and not any(j.rejected or j.shed or j.late for j in free)
    assert all(j.end is not None for j in free)
    assert set(r["slo"]) == {"all", "fast", "none"}
    assert r["slo"]["none"]["rejected"] == r["slo"]["none"]["shed"] == 0


def test_queue_bound_refuses_any_job_as_the_real_submit():
    w = slo_workload({"one": ONE, "two": {"nodes": {"x": {"model": "m", "exec_ms": 30}}}},
                     slo_dags=[], rate=66.0)
    sim, r = run(w, max_queue_ms=100.0)
    assert any(j.rejected for j in sim.jobs) and not any(j.shed for j in sim.jobs)
    assert r["lost"] == 0 and "tasks" in r


def test_same_functions_as_the_real_path():
    """No copy of the rules: the simulator imports the planner's, as the runtime does."""
    from compass_celery import admission as edge
    from compass_celery.jobs import runtime, submit

    assert sim_runner.judge is admission.judge is edge.judge
    for name in ("job_finish_ms", "job_wait_ms", "tails_ms"):
        assert getattr(sim_runner, name) is getattr(admission, name) is getattr(submit, name)
    assert sim_runner.should_shed is admission.should_shed is runtime.should_shed
    # a worker drops at dequeue by the worker core's rule, on the planner's latest start
    from compass_celery.worker import core

    assert sim_cluster.drop_at_dequeue is core.drop_at_dequeue
    assert core.latest_start is admission.latest_start


def test_judge_gets_the_plans_finish_and_wait(monkeypatch):
    calls = []
    real = sim_runner.judge

    def spy(slo, predicted, wait, **kw):
        calls.append((slo, predicted, wait, kw))
        return real(slo, predicted, wait, **kw)

    monkeypatch.setattr(sim_runner, "judge", spy)
    w = slo_workload(jobs=20)
    Simulation(w, "compass", job_stream(w), admission=False, max_queue_ms=5000.0).run()
    assert len(calls) == 20
    slo, predicted, wait, kw = calls[0]
    assert slo == w.slo("one") and slo.deadline_ms == 300.0
    assert predicted == pytest.approx(100.0 + 30.0)  # cold: the 150 MB load, then the run
    # the first job: the model loads on a cold cluster (nobody holds it), nothing learned
    assert wait == 0.0 and kw == {"max_queue_ms": 5000.0, "admission": False,
                                  "load_ms": pytest.approx(100.0),
                                  "headroom": DEFAULT_HEADROOM, "error_ms": 0.0,
                                  "missing": True}


def test_cli_admission_flags_and_table(tmp_path):
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    path = tmp_path / "w.json"
    path.write_text(json.dumps(raw_workload(jobs=200)))
    out = tmp_path / "r.json"
    run = CliRunner().invoke(compass_command, [
        "sim", "run", "--workload", str(path), "--policies", "compass,jsq",
        "--admission", "off", "--json", str(out)])
    assert run.exit_code == 0, run.output
    off = json.loads(out.read_text())["policies"]["compass"]
    assert off["slo"]["fast"]["rejected"] == 0 and off["slo"]["fast"]["late"] > 0
    run = CliRunner().invoke(compass_command, [
        "sim", "run", "--workload", str(path), "--policies", "compass", "--max-queue-ms",
        "50", "--warm"])
    assert run.exit_code == 0, run.output
    text = run.output
    assert "adm attain" in text and "goodput/s" in text and "not run" in text



def test_a_task_is_judged_once_when_its_worker_takes_it_not_again_after_its_load():
    """A real worker checks a task's ``expires`` when it takes the message; the model
    load comes after, inside the task. A task taken before its latest start runs, even
    when the load it waited for ends past that start (the plan counted the load in its
    tail): the simulator used to judge it again then and drop a job that met its
    deadline. One taken after its latest start is still dropped."""
    engine = Engine()
    done, shed = [], []
    specs = slo_workload().cluster.workers  # 150 MB at 1,500 MB/s: a 100 ms load
    cluster = SimCluster(specs, engine, {"m": 150.0}, shared=False,
                         on_done=lambda t, w: done.append(t), on_failed=shed.append,
                         on_shed=lambda t, w: shed.append(t))
    (worker,) = cluster.workers
    # planned: load 100 + run 30 from its start, due at 140 ms: latest start 10 ms
    taken = SimTask("J", "a", "m", 30.0, due_s=0.14, tail_ms=130.0)
    cluster.send(taken, worker.name)
    engine.run()
    assert done == [taken] and not shed and taken.start_at == 100.0
    late = SimTask("K", "b", "m", 30.0, due_s=0.14, tail_ms=130.0)  # latest start passed
    cluster.send(late, worker.name)
    engine.run()
    assert done == [taken] and shed == [late] and late.dropped
