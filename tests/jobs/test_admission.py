"""Deadlines with real workers: refused at once when the plan says a job will miss,
taken late when asked, dropped unrun once it falls behind, and never lost.

One emulated worker; "liars" are tasks that declare a short run time and sleep long,
so an admitted job falls behind its plan the way a real one does under a surprise.
"""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery.exceptions import TaskRevokedError

from compass_celery import Dag
from compass_celery.emulated import make_app
from compass_celery.errors import DeadlineMissed, Rejected
from compass_celery.local import wait_until
from compass_celery.state import keys
from compass_celery.testing import worker_logs

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "1600", "--compass-preload", "captioner"]
M = "captioner"


@pytest.fixture
def one(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_REDIS_URL": compass_redis_url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0",
           "COMPASS_BENCH_LEDGER_URL": compass_redis_url}  # counts each task's starts
    ws = [compass_workers("compass_celery.emulated_app", "adm@one", *GPU, env=env)]
    app = make_app(compass_redis_url, state_url=compass_redis_url, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1,
                   40, "a live worker")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.log = redis.Redis.from_url(compass_redis_url)
    app.workers = ws
    yield app
    app.compass.close()


def _infer(app, run_ms: float, declared_ms: float | None = None, **options):
    """emulated.infer that sleeps ``run_ms`` and tells the planner ``declared_ms``."""
    compass = {"model": M, "exec_ms": declared_ms if declared_ms is not None else run_ms,
               **options.pop("compass", {})}
    return app.tasks["emulated.infer"].apply_async((M, run_ms, 0), compass=compass,
                                                   **options)


def _chain(app, name: str, first_ms: float, declared_ms: float) -> Dag:
    dag = Dag(app, name)
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    a = dag.node("a", infer.s(M, first_ms, 0), model=M, exec_ms=declared_ms)
    dag.node("b", step.s(M, 50.0), after=[a], model=M, exec_ms=50.0)
    return dag


def _started(app, task_id: str) -> int:
    return int(app.log.hget(keys.key(keys.BENCH_STARTS, "compass"), task_id) or 0)


def _job_keys(app) -> int:
    return len(app.log.keys("compass:job:*"))


def _busy(app, seconds: float) -> None:
    """Queue ``seconds`` of declared, honest work on the worker (no deadline)."""
    _infer(app, seconds * 1000)
    wait_until(lambda: app.compass.store.snapshot(time.time(), 3.0).workers[0].backlog_ms
               > seconds * 500, 10, "the backlog to be published")


def test_a_job_that_would_miss_is_refused_at_once_and_nothing_is_written(one):
    app = one
    _busy(app, 3.0)
    before = _job_keys(app)
    t0 = time.perf_counter()
    with pytest.raises(Rejected) as err:
        _chain(app, "click", 50.0, 50.0).apply_async(deadline_ms=400)
    took = time.perf_counter() - t0
    e = err.value
    assert e.deadline_ms == 400 and e.miss_ms > 1000, e
    # it frees up when the backlog has drained by the miss, within a second of the truth
    assert 1.0 < e.retry_after_s < 3.5 and e.retry_after >= 2, e
    assert "400 ms deadline" in str(e) and "retry after" in str(e)
    assert took < 0.5
    assert _job_keys(app) == before  # refused before anything was written
    with pytest.raises(Rejected, match="task 'emulated.infer'"):  # a plain task too
        _infer(app, 50, compass={"deadline_ms": 400})


def test_a_plain_task_takes_the_dags_keywords(one):
    """``deadline_ms=``, ``slo=`` and ``priority=`` on a plain task are read as a Dag reads
    them (they were handed to Celery and ignored): admitted with a due time and its
    class's priority, refused at once when the plan says it would miss."""
    app = one
    bare = _infer(app, 50, deadline_ms=5000)
    placed = app.compass.placement(bare.id)
    assert placed.due > time.time() and placed.priority == 0  # a bare deadline: priority 0
    urgent = _infer(app, 50, slo="interactive")
    placed = app.compass.placement(urgent.id)
    assert placed.slo == "interactive" and placed.due and placed.priority == 9
    assert _infer(app, 50, deadline_ms=5000, priority=7).get(timeout=20) is not None
    assert app.compass.placement(urgent.id).priority == 9
    bare.get(timeout=20), urgent.get(timeout=20)
    _busy(app, 3.0)
    with pytest.raises(Rejected, match="task 'emulated.infer'"):
        _infer(app, 50, deadline_ms=400)
    with pytest.raises(Rejected, match="SLO class 'interactive'"):
        _infer(app, 50, slo="interactive")


def test_a_late_class_is_taken_marked_late_and_run_to_the_end(one):
    app = one
    _busy(app, 1.5)
    job = _chain(app, "report", 50.0, 50.0).apply_async(deadline_ms=300, on_miss="late")
    assert app.log.hget(f"compass:job:{{{job.id}}}", "late") == b"1"
    out = job.get(timeout=30)
    assert set(out) == {"b"}


def test_a_job_that_falls_behind_is_shed_before_its_next_node_runs(one):
    app = one
    t0 = time.time()
    # planned 50 + 50 ms against 1,000 ms: admitted; node a then takes 1.5 s
    job = _chain(app, "surprise", 1500.0, 50.0).apply_async(deadline_ms=1000)
    with pytest.raises(DeadlineMissed) as err:
        job.get(timeout=30)
    assert time.time() - t0 < 5  # at a's end, not at the job timeout
    assert err.value.info["node"] == "b" and "shed" in err.value.info["exc"]
    assert err.value.info["task"] == "emulated.step"  # b's own task, not a's
    assert _started(app, f"{job.id}.a") == 1
    # a negative check: b, had it been sent rather than shed, would start within a hop
    # of a's end on the idle worker; half a second gives it that chance
    time.sleep(0.5)
    assert _started(app, f"{job.id}.b") == 0


def test_a_queued_task_past_its_latest_start_is_dropped_unrun(one):
    app = one
    liar = _infer(app, 1500.0, declared_ms=50.0)  # ahead of it: planned 50 ms, runs 1.5 s
    wait_until(lambda: _started(app, liar.id), 10, "the liar to start")
    late = _infer(app, 50.0, deadline_ms=600)  # admitted: ~100 ms planned
    own = _infer(app, 50.0, expires=0.3)  # the caller's own expiry, no deadline: Celery's
    with pytest.raises(DeadlineMissed) as err:  # as a Dag's is, not Celery's "expired"
        late.get(timeout=20)
    info = err.value.info
    assert info["task"] == "emulated.infer" and info["task_id"] == late.id, info
    assert info["job"] is None and info["worker"] == "adm@one" and "shed" in info["exc"]
    assert f"task emulated.infer[{late.id}]" in str(err.value)
    assert late.state == "REVOKED"  # still Celery's state for a task dropped unrun
    assert _started(app, late.id) == 0
    with pytest.raises(TaskRevokedError, match="expired"):
        own.get(timeout=20)
    job = _chain(app, "queued", 50.0, 50.0)
    liar = _infer(app, 1500.0, declared_ms=50.0)
    wait_until(lambda: _started(app, liar.id), 10, "the second liar to start")
    handle = job.apply_async(deadline_ms=600)
    t0 = time.time()
    with pytest.raises(DeadlineMissed):
        handle.get(timeout=30)
    assert time.time() - t0 < 5  # failed when its worker reached it, not at the timeout


def test_degrade_runs_the_cheaper_alternative(one):
    app = one
    _busy(app, 0.5)
    cheap = Dag(app, "cheap")
    cheap.node("only", app.tasks["emulated.infer"].s(M, 20.0, 0), model=M, exec_ms=20.0)
    # the full job (600 + 50 ms) cannot finish within 800 ms less the 20% headroom, behind
    # what is left of half a second of work; the cheap one (20 ms) can
    full = _chain(app, "full", 600.0, 600.0)
    job = full.apply_async(deadline_ms=800, on_miss="degrade", alternative=cheap)
    assert set(job.get(timeout=30)) == {"only"}


def test_a_queue_bound_in_time_refuses_work_without_a_deadline(compass_redis_url, one):
    app = make_app(compass_redis_url, state_url=compass_redis_url,
                   compass_snapshot_ttl_s=0.0, compass_max_queue_ms=500)
    try:
        _busy(one, 2.0)
        with pytest.raises(Rejected, match="queue full"):
            _chain(app, "batch", 50.0, 50.0).apply_async()
    finally:
        app.compass.close()


def test_a_deadline_shorter_than_a_load_does_not_lock_the_model_out(one):
    """The first job needing a model nobody holds misses only because of the load: it is
    taken (late) and loads the model, so the next one is admitted on time."""
    app = one
    dag = Dag(app, "cold")
    # translator: 300 MB at 1,500 MB/s, a 200 ms load against a 150 ms deadline
    dag.node("t", app.tasks["emulated.infer"].s("translator", 20.0, 0), model="translator",
             exec_ms=20.0)
    first = dag.apply_async(deadline_ms=150)
    assert app.log.hget(f"compass:job:{{{first.id}}}", "late") == b"1"
    assert set(first.get(timeout=20)) == {"t"}
    wait_until(lambda: "translator" in app.compass.store.snapshot(time.time(), 3.0)
               .workers[0].resident, 10, "the translator to show as resident")
    second = dag.apply_async(deadline_ms=150)
    assert app.log.hget(f"compass:job:{{{second.id}}}", "late") == b"0"
    assert set(second.get(timeout=20)) == {"t"}


def test_admission_learns_how_late_its_plans_run(one):
    """A job that ends later than planned moves its class's learned plan error up one
    step, a share of its deadline (the same rule in Redis as in the in-process store and
    the planner)."""
    from compass_celery.planner.admission import ERROR_QUANTILE, error_step_ms
    from compass_celery.state.store import MemoryStateStore

    app = one
    # 250 ms late; the class's 400 ms deadline widened, so a busy machine's hops cannot
    # shed it before it ends (only a job that ends teaches)
    job = _chain(app, "slowish", 300.0, 50.0).apply_async(slo="interactive", deadline_ms=1500)
    job.get(timeout=20)
    key = "interactive"
    wait_until(lambda: key in app.compass.store.snapshot(time.time(), 3.0).plan_errors, 5,
               "the learned plan error")
    learned = app.compass.store.snapshot(time.time(), 3.0).plan_errors[key]
    assert learned == pytest.approx(error_step_ms(1500) * ERROR_QUANTILE)  # 7.5 ms a step
    memory = MemoryStateStore()
    memory.record_plan_error(key, 250.0, ERROR_QUANTILE, error_step_ms(1500))
    assert memory.snapshot(time.time(), 3.0).plan_errors[key] == pytest.approx(learned)


def test_a_learned_plan_error_past_the_deadline_does_not_lock_the_class_out(one):
    """Overload can teach admission that plans run later than the deadline itself; the
    error it adds is capped, so a job whose plan is short is still taken, finishes, and
    keeps teaching. Uncapped, every job is refused and none ever ends to lower it."""
    one.log.hset(keys.key(keys.PLAN_ERRORS, "compass"), "interactive",
                 json.dumps({"error_ms": 5000.0, "n": 500}))  # as the stores keep it
    url = one.conf.broker_url
    app = make_app(url, state_url=url, compass_snapshot_ttl_s=0.0)  # reads it all afresh
    assert app.compass.store.snapshot(time.time(), 3.0).plan_errors["interactive"] == 5000.0
    job = _chain(app, "honest", 50.0, 50.0).apply_async(slo="interactive")  # 400 ms
    assert set(job.get(timeout=20)) == {"b"}


def test_a_run_time_nobody_declared_is_learned_not_refused_for_good(one):
    """A node without a declared run time is planned at compass_default_exec_ms (100 ms)
    until a run is measured. Under a 50 ms deadline that plan misses; on an idle worker
    the job is taken late, so the run is measured, and the next job is judged on it."""
    app = one
    infer = app.tasks["emulated.infer"]

    def job(name):
        dag = Dag(app, name)
        dag.node("only", infer.s(M, 10.0, 0), model=M)  # 10 ms, declared by nobody
        return dag.apply_async(deadline_ms=50)

    first = job("first")
    assert app.log.hget(f"compass:job:{{{first.id}}}", "late") == b"1"  # taken late
    assert set(first.get(timeout=20)) == {"only"}

    def judged_on_it() -> bool:  # what the submission reads (a snapshot read ahead)
        snap = app.compass.reader.get()
        return snap.profiles.get(f"emulated.infer|{M}") is not None \
            and all(w.backlog_ms < 1 for w in snap.workers)

    wait_until(judged_on_it, 5, "the learned run time, and the first job's charge settled")
    second = job("second")  # judged on the measured ~10 ms: on time
    assert app.log.hget(f"compass:job:{{{second.id}}}", "late") != b"1"
    assert set(second.get(timeout=20)) == {"only"}
