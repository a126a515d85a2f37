"""Job DAGs on a real Redis with real worker processes."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
import redis

from compass_celery.jobs import JobFailed
from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000"]


@pytest.fixture
def cluster(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    ws = [compass_workers("tests.support.jobapp", "a@jobs", *GPU, "--compass-preload",
                          "big,small", env=env),
          compass_workers("tests.support.jobapp", "b@jobs", *GPU, "--compass-preload",
                          "small", env=env)]
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    store = app.compass.store
    try:
        wait_until(lambda: len(store.snapshot(time.time(), 3.0).workers) == 2, 30,
                   "two job workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.log = redis.Redis.from_url(compass_redis_url)
    app.workers = ws
    return app


def runs(app, job_id=None) -> Counter:
    entries = [e.decode().split(":") for e in app.log.lrange("ran", 0, -1)]
    return Counter(f"{j}:{n}" for j, n, _ in entries if job_id is None or j == job_id)


def test_linear_chain(cluster):
    app = cluster
    dag = Dag(app, "chain")
    a = dag.node("a", app.tasks["j.src"].s(1))
    b = dag.node("b", app.tasks["j.add"].s(2), after=[a])
    dag.node("c", app.tasks["j.add"].s(3), after=[b])
    job = dag.apply_async()
    assert job.get(timeout=30) == {"c": 6}, worker_logs(app.workers)
    assert runs(app, job.id) == Counter({f"{job.id}:a": 1, f"{job.id}:b": 1,
                                         f"{job.id}:c": 1})
    where = job.placement()
    assert set(where) == {"a", "b", "c"}
    assert all(w["worker"] in ("a@jobs", "b@jobs") for w in where.values())
    assert all("run_ms" in w and "queued_ms" in w for w in where.values())


def test_fan_out_fan_in_keeps_predecessor_order(cluster):
    app = cluster
    dag = Dag(app, "diamond")
    a = dag.node("a", app.tasks["j.src"].s(10))
    b = dag.node("b", app.tasks["j.add"].s(1), after=[a])
    c = dag.node("c", app.tasks["j.add"].s(2), after=[a])
    e = dag.node("e", app.tasks["j.add"].s(3), after=[a])
    dag.node("d", app.tasks["j.collect"].s(), after=[e, b, c])
    job = dag.apply_async()
    assert job.get(timeout=30) == {"d": [13, 11, 12]}
    assert sum(runs(app, job.id).values()) == 5


def test_random_20_node_dag(cluster):
    app = cluster
    rng = random.Random(5)
    dag = Dag(app, "random20")
    preds: dict[int, list[int]] = {}
    for i in range(20):
        preds[i] = sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3))))
        dag.node(f"n{i}", app.tasks["j.sum1"].s(), after=[f"n{p}" for p in preds[i]])
    expected: dict[int, int] = {}
    for i in range(20):
        ins = [expected[p] for p in preds[i]]
        expected[i] = 1 if not ins else (ins[0] if len(ins) == 1 else sum(ins)) + 1
    sinks = [i for i in range(20) if not any(i in preds[j] for j in range(20))]
    job = dag.apply_async()
    assert job.get(timeout=60) == {f"n{i}": expected[i] for i in sinks}
    assert runs(app, job.id) == Counter({f"{job.id}:n{i}": 1 for i in range(20)})


def test_join_race_sends_join_exactly_once(cluster):
    app = cluster
    jobs = []
    for _ in range(25):
        dag = Dag(app, "race")
        a = dag.node("a", app.tasks["j.src"].s(1))
        b = dag.node("b", app.tasks["j.add"].s(1), after=[a])
        c = dag.node("c", app.tasks["j.add"].s(2), after=[a])
        dag.node("d", app.tasks["j.collect"].s(), after=[b, c])
        jobs.append(dag.apply_async())
    for job in jobs:
        assert job.get(timeout=60) == {"d": [2, 3]}
    counts = runs(app)
    for job in jobs:
        assert counts[f"{job.id}:d"] == 1
    # the two branches really ran on both workers in some jobs (the race happened)
    split = [j for j in jobs if len({v["worker"] for n, v in j.placement().items()
                                     if n in "bc"}) == 2]
    assert split, "no job ran its branches on different workers"


def test_successor_moves_when_planned_worker_is_made_busy(cluster):
    app = cluster
    dag = Dag(app, "move")
    h = dag.node("h", app.tasks["j.heavy"].s(7), output_kb=500)
    dag.node("l", app.tasks["j.light"].s(), after=[h])
    job = dag.apply_async()
    assert job.placement()["l"]["planned"] == "a@jobs"  # collocated with its input
    # while h runs on a@jobs (the only worker holding "big"), give it 2 s more work
    busy = [app.tasks["j.slow"].delay() for _ in range(2)]
    assert [app.compass.placement(r.id).worker for r in busy] == ["a@jobs", "a@jobs"]
    assert job.get(timeout=30) == {"l": 7}
    where = job.placement()["l"]
    assert where["moved"] and where["moved_from"] == "a@jobs"
    assert where["worker"] == "b@jobs"
    for r in busy:
        r.get(timeout=30)


def test_successor_stays_when_planned_worker_is_not_busy(cluster):
    app = cluster
    dag = Dag(app, "stay")
    h = dag.node("h", app.tasks["j.heavy"].s(8), output_kb=500)
    dag.node("l", app.tasks["j.light"].s(), after=[h])
    job = dag.apply_async()
    assert job.get(timeout=30) == {"l": 8}
    where = job.placement()["l"]
    assert not where["moved"] and where["worker"] == where["planned"] == "a@jobs"


def test_failing_middle_task_fails_job_and_nothing_runs_after(cluster):
    app = cluster
    dag = Dag(app, "failing")
    a = dag.node("a", app.tasks["j.src"].s(1))
    b = dag.node("b", app.tasks["j.boom"].s(), after=[a])
    dag.node("c", app.tasks["j.add"].s(1), after=[b])
    job = dag.apply_async()
    with pytest.raises(JobFailed) as info:
        job.get(timeout=30)
    err = info.value.info
    assert err["node"] == "b" and err["task"] == "j.boom"
    assert err["worker"] in ("a@jobs", "b@jobs")
    assert err["exc_type"] == "ValueError" and "boom on 1" in err["exc"]
    assert "node 'b'" in str(info.value) and "ValueError" in str(info.value)
    # a negative check: c, had it been sent at b's failure, would start within a hop on
    # an idle worker; half a second gives it that chance
    time.sleep(0.5)
    assert f"{job.id}:c" not in runs(app, job.id)
    assert job.status == "FAILURE"


def test_job_timeout_fails_the_job(cluster):
    app = cluster
    dag = Dag(app, "slowjob")
    a = dag.node("a", app.tasks["j.src"].s(1))
    dag.node("b", app.tasks["j.wait"].s(3.0), after=[a])
    job = dag.apply_async(timeout_s=0.5)
    with pytest.raises(JobFailed, match="deadline"):
        job.get(timeout=10)


def test_failure_revokes_queued_sibling_branches(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    w = compass_workers("tests.support.jobapp", "solo@jobs", *GPU, "--compass-preload",
                        "big,small", env=env)
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1, 30,
               "one job worker")
    app.log = redis.Redis.from_url(compass_redis_url)
    dag = Dag(app, "revoke")
    a = dag.node("a", app.tasks["j.src"].s(1))
    dag.node("b", app.tasks["j.boom"].s(), after=[a])     # sent first, fails
    c = dag.node("c", app.tasks["j.wait"].s(0.5), after=[a])  # queued behind b
    dag.node("d", app.tasks["j.add"].s(1), after=[c])
    job = dag.apply_async()
    with pytest.raises(JobFailed, match="node 'b'"):
        job.get(timeout=30)
    # the one worker takes its queue in priority order: once a task sent now at the
    # lowest priority has run, c (queued earlier, not lower) has been taken or removed
    assert app.tasks["j.src"].apply_async((0,), priority="batch").get(timeout=20) == 0
    ran = runs(app, job.id)
    assert f"{job.id}:c" not in ran and f"{job.id}:d" not in ran, (ran, w.log()[-2000:])


def test_backlog_reconciles_to_what_the_queue_holds(cluster):
    app = cluster
    store = app.compass.store
    store.charge("b@jobs", 50_000)  # a drifted estimate (e.g. a lost decrement)
    wait_until(lambda: {w.name: w.backlog_ms for w in store.snapshot(time.time(), 3.0)
                        .workers}["b@jobs"] < 1000, 10, "the reconciler to correct the backlog")


def test_a_producer_sees_its_own_submitted_job_before_reading_again(compass_redis_url):
    """A job's charges are folded into the submitting process's snapshot at once (as the
    router's are), so the next job it plans within the snapshot's lifetime sees them."""
    from compass_celery.planner.types import WorkerView

    app = make_app(compass_redis_url, compass_snapshot_ttl_s=60.0,
                   compass_key_prefix="ownjobs", compass_heartbeat_timeout_s=3600.0)
    for name in ("x@own", "y@own"):  # records only: the jobs stay queued
        app.compass.store.publish(WorkerView(
            name=name, queue=app.compass.queue_for(name), gpu_total_mb=4000,
            gpu_free_mb=1000, resident=frozenset({"big", "small"}), heartbeat=time.time()))
    before = app.compass.reader.get()
    assert all(w.backlog_ms == 0 and w.pending_ms == 0 for w in before.workers)
    dag = Dag(app, "heavy-then-add")
    a = dag.node("a", app.tasks["j.heavy"].s(1))
    dag.node("b", app.tasks["j.add"].s(2), after=[a])
    handle = dag.apply_async()
    plan = {n: p["planned"] for n, p in handle.placement().items()}
    snap = app.compass.reader.get()
    assert app.compass.reader.reads == 1  # no second read: the charges came from the job
    by_name = {w.name: w for w in snap.workers}
    assert by_name[plan["a"]].backlog_ms == pytest.approx(300.0)  # the source, sent
    assert by_name[plan["b"]].pending_ms == pytest.approx(5.0)  # its successor, waiting
    second = dag.apply_async()
    assert second.placement()["a"]["planned"] != plan["a"]  # planned around the first


def test_a_job_seen_running_here_is_not_asked_again_until_it_fails_here(compass_redis_url,
                                                                         monkeypatch):
    """A successor's receipt check trusts this worker's own completion of the job for
    SEEN_RUNNING_S (no round trip); a failure here, or the window passing, asks Redis."""
    from compass_celery.jobs import runtime as job_runtime
    from compass_celery.jobs.runtime import JobRuntime

    app = make_app(compass_redis_url, compass_key_prefix="seen")
    jobs = JobRuntime(app.compass, "w@seen")
    key = jobs.keys("j1").job
    app.log = redis.Redis.from_url(compass_redis_url)
    app.log.hset(key, "state", "FAILURE")  # failed elsewhere, as far as Redis knows
    assert jobs.job_state("j1") == "FAILURE"
    jobs._saw_running("j1")  # as a completion here that released successors does
    assert jobs.job_state("j1") == "RUNNING"  # trusted: Redis is not asked
    monkeypatch.setattr(job_runtime, "SEEN_RUNNING_S", 0.0)
    assert jobs.job_state("j1") == "FAILURE"  # the window passed: asked again
    monkeypatch.setattr(job_runtime, "SEEN_RUNNING_S", 60.0)
    jobs._saw_running("j1")
    app.log.hset(key, "state", "RUNNING")
    jobs.fail({"id": "j1", "node": "b"}, "j1.b", ValueError("boom"), "failed here")
    assert jobs.job_state("j1") == "FAILURE"  # a failure here is never trusted away
    assert jobs.job_state("gone") == "UNKNOWN"


def test_a_node_sent_moments_ago_is_not_asked_about_unless_its_job_failed_here(
        compass_redis_url):
    """A receipt trusts a node sent within SEEN_RUNNING_S (its sender saw the job running):
    no round trip between a busy worker's tasks. An older send, one from a clock ahead of
    this one, or a job failed on this worker asks Redis."""
    import time

    from compass_celery.jobs.runtime import SEEN_RUNNING_S, JobRuntime

    app = make_app(compass_redis_url, compass_key_prefix="fresh")
    jobs = JobRuntime(app.compass, "w@fresh")
    log = redis.Redis.from_url(compass_redis_url)
    log.hset(jobs.keys("j2").job, "state", "FAILURE")  # failed elsewhere since the send
    now = time.time()
    assert jobs.job_state("j2", now - 0.01) == "RUNNING"  # trusted: Redis is not asked
    assert jobs.job_state("j2", now - 2 * SEEN_RUNNING_S) == "FAILURE"  # too old: asked
    assert jobs.job_state("j2", now + 5.0) == "FAILURE"  # a send "from the future": asked
    assert jobs.job_state("j2") == "FAILURE"  # no send time: asked
    log.hset(jobs.keys("j3").job, "state", "RUNNING")
    jobs.fail({"id": "j3", "node": "b"}, "j3.b", ValueError("boom"), "failed here")
    assert jobs.job_state("j3", time.time()) == "FAILURE"  # failed here: always asked


def test_planned_work_counts_at_its_level_and_is_released_when_sent(cluster):
    """A successor waiting for its input is planned work at its job's level
    (PENDING_QUEUED), which an urgent plan reads to skip what it will overtake; sending
    it (a real worker's completion of its input) releases it, at that level too."""
    from compass_celery.state import keys

    app = cluster
    level_key = keys.key(keys.PENDING_QUEUED, "compass")
    dag = Dag(app, "wait-then-add")
    a = dag.node("a", app.tasks["j.wait"].s(1, 1.0))
    dag.node("b", app.tasks["j.add"].s(2), after=[a])
    job = dag.apply_async(priority="interactive")
    planned = job.placement()["b"]["planned"]
    assert float(app.log.hget(level_key, keys.queued_member(planned, 9)) or 0) \
        == pytest.approx(5.0)  # j.add's 5 ms, planned at level 9 while a runs
    snap = app.compass.store.snapshot(time.time(), 30.0)
    assert {w.name: dict(w.pending_queued_ms) for w in snap.workers}[planned] == {9: 5.0}
    assert job.get(timeout=30) == {"b": 3}
    wait_until(lambda: all(float(v) == 0 for v in app.log.hvals(level_key)), 10,
               "planned work at level 9 released")
    assert all(float(v) == 0 for v in app.log.hvals(keys.key(keys.PENDING, "compass")))


def test_inputs_read_from_redis_ride_the_callers_pipeline_in_one_round_trip(
        compass_redis_url):
    """A successor's start reads the outputs its worker does not hold on the pipeline
    its start's bookkeeping is queued on: one round trip runs both; with every output
    held here nothing is read, and the bookkeeping is left for the caller to run."""
    import json

    from compass_celery.jobs.keys import INPUT_REF
    from compass_celery.jobs.runtime import JobRuntime

    app = make_app(compass_redis_url, compass_key_prefix="inpipe")
    jobs = JobRuntime(app.compass, "w@inpipe")
    log = redis.Redis.from_url(compass_redis_url)
    log.hset(jobs.keys("j4").outputs, mapping={"a": json.dumps([1]), "b": json.dumps("x")})
    client = app.compass.store.client
    pipe = client.pipeline(transaction=False)
    pipe.set("inpipe:mark", "1")  # the caller's bookkeeping
    log.config_resetstat()
    args = [{INPUT_REF: {"preds": ["a", "b"], "single": False}}, 7]
    jobs.resolve_inputs({"id": "j4", "node": "c"}, args, pipe)
    stats = log.info("commandstats")
    assert args == [[[1], "x"], 7]
    assert log.get("inpipe:mark") == b"1" and not len(pipe)  # ran with the read
    assert stats["cmdstat_hmget"]["calls"] == 1 and stats["cmdstat_set"]["calls"] == 1
    jobs.outputs.put("j5", "a", {"k": 2}, 8)  # held here: nothing to read
    pipe.set("inpipe:mark", "2")
    args = [{INPUT_REF: {"preds": ["a"], "single": True}}]
    jobs.resolve_inputs({"id": "j5", "node": "c"}, args, pipe)
    assert args == [{"k": 2}] and len(pipe) == 1  # left to the caller
    pipe.reset()
