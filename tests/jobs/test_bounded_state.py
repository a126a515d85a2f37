"""State that must not outlive its use: leases, deadline entries, stored inputs, outputs
over the limit, and edges to another Dag's nodes (issue 23, part 6)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

from compass_celery import Compass
from compass_celery.broker.kombu_redis import redis_time
from compass_celery.dag_validation import DagValidationError
from compass_celery.errors import CompassInputError
from compass_celery.jobs import JobFailed
from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import JobKeys, deadlines_key
from compass_celery.local import wait_until
from compass_celery.state import keys
from compass_celery.testing import add_worker, worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "big,small"]
LEASES = keys.key(keys.LEASES, "compass")
DEADLINES = deadlines_key("compass")


@pytest.fixture
def one(compass_redis_url, compass_workers):
    """One real jobapp worker (heartbeat timeout 3 s: leases renewed every second)."""
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    ws = [compass_workers("tests.support.jobapp", "l1@bounded", *GPU, env=env)]
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1,
                   30, "a worker")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.log = redis.Redis.from_url(compass_redis_url)
    app.workers = ws
    return app


def test_a_lease_is_deleted_when_its_task_ends(one):
    app = one
    dag = Dag(app, "long")
    dag.node("a", app.tasks["j.wait"].s(7, 2.5))  # outlasts a renewal (every 1 s)
    job = dag.apply_async()
    wait_until(lambda: app.log.zcard(LEASES) == 1, 10, "the running task's lease")
    assert job.get(timeout=20) == {"a": 7}
    # gone within a renewal round, not after 10 lease timeouts (and only on a dead queue)
    wait_until(lambda: app.log.zcard(LEASES) == 0, 3, "the ended task's lease to go")


def test_stale_leases_are_pruned_on_every_tick(one):
    app = one
    # a lease nobody renews (its runner died) while no queue is dead
    app.log.zadd(LEASES, {"lost-tag": redis_time(app.log) - 3600})
    assert app.log.zcard(keys.key(keys.DEAD_QUEUES, "compass")) == 0
    wait_until(lambda: app.log.zcard(LEASES) == 0, 8, "the stale lease to be pruned")


def test_a_jobs_deadline_entry_goes_when_it_succeeds_or_fails(one):
    app = one
    dag = Dag(app, "ok")
    a = dag.node("a", app.tasks["j.src"].s(1))
    dag.node("b", app.tasks["j.add"].s(2), after=[a])
    job = dag.apply_async(timeout_s=600)
    assert job.get(timeout=20) == {"b": 3}
    wait_until(lambda: app.log.zscore(DEADLINES, job.id) is None, 2,
               "the succeeded job's deadline entry to go")
    bad = Dag(app, "bad")
    a = bad.node("a", app.tasks["j.src"].s(1))
    bad.node("b", app.tasks["j.boom"].s(), after=[a])
    failed = bad.apply_async(timeout_s=600)
    with pytest.raises(JobFailed):
        failed.get(timeout=20)
    wait_until(lambda: app.log.zscore(DEADLINES, failed.id) is None, 2,
               "the failed job's deadline entry to go")
    assert app.log.zcard(DEADLINES) == 0


def test_an_input_is_stored_once_and_its_size_is_limited(one):
    app = one
    blob = "x" * (2 * 2**20)  # 2 MB
    dag = Dag(app, "in")
    a = dag.node("a", app.tasks["j.wait"].s(blob, 0.0))
    dag.node("b", app.tasks["j.add"].s("!"), after=[a])
    job = dag.apply_async()
    assert job.get(timeout=30) == {"b": blob + "!"}
    record = app.log.hgetall(JobKeys.of("compass", job.id).job)
    stored = sum(len(v) for v in record.values())
    # the source's input travelled in its message only; no copy stays for the job's TTL
    assert stored < 64 * 1024, {k: len(v) for k, v in record.items()}
    assert job.placement().keys() == {"a", "b"}
    app.conf.compass_max_input_kb = 1024
    app.compass.__dict__.pop("settings", None)
    big = Dag(app, "toolarge")
    big.node("src", app.tasks["j.wait"].s(blob, 0.0))
    with pytest.raises(CompassInputError, match=r"node 'src'.*2048 KB.*compass_max_input_kb"
                                                r"=1024") as err:
        big.apply_async()
    assert isinstance(err.value, DagValidationError)


def test_an_output_over_the_limit_names_its_task(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_MAX_OUTPUT_KB": "64"}
    w = compass_workers("tests.support.jobapp", "o1@bounded", *GPU, env=env)
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0, compass_max_output_kb=64)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1, 30,
               "a worker")
    dag = Dag(app, "bigout")
    a = dag.node("a", app.tasks["j.src"].s(1))
    dag.node("b", app.tasks["j.big"].s(200), after=[a])
    job = dag.apply_async()
    with pytest.raises(JobFailed) as err:
        job.get(timeout=20)
    assert err.value.info["task"] == "j.big", (err.value.info, w.log())
    assert f"{job.id}.b" in err.value.info["exc"], err.value.info
    # a node that declares an output over the limit is refused before anything runs
    declared = Dag(app, "declared")
    declared.node("a", app.tasks["j.src"].s(1), output_kb=500)
    with pytest.raises(CompassInputError, match=r"node 'a'.*500 KB.*compass_max_output_kb=64"):
        declared.apply_async()


# -- without processes: eager runs and building a Dag ------------------------------------
@pytest.fixture
def eager():
    app = Celery("boundedeager")
    app.conf.task_always_eager = True
    app.conf.compass_models = {"small": 50}
    app.conf.compass_max_output_kb = 64
    Compass(app)

    @app.task(name="b.src", shared=False, compass_model="small", compass_exec_ms=5)
    def src(x):
        return x

    @app.task(name="b.big", shared=False, compass_model="small", compass_exec_ms=5)
    def big(inp, kb):
        return "x" * (kb * 1024)

    add_worker(app, "g0", gpu_mb=4000, resident=["small"])
    return app


def test_eager_output_over_the_limit_fails_the_job_by_name(eager):
    dag = Dag(eager, "bigout")
    a = dag.node("a", eager.tasks["b.src"].s(1))
    dag.node("b", eager.tasks["b.big"].s(200), after=[a])
    job = dag.apply_async()
    with pytest.raises(JobFailed, match=r"node 'b'.*task b\.big.*over compass_max_output_kb=64"):
        job.get()
    assert json.dumps(job.error)  # the same plain record a worker writes


def test_eager_input_over_the_limit_is_refused(eager):
    eager.conf.compass_max_input_kb = 1
    eager.compass.__dict__.pop("settings", None)
    dag = Dag(eager, "in")
    dag.node("a", eager.tasks["b.src"].s("y" * 4096))
    with pytest.raises(CompassInputError, match=r"node 'a'.*4 KB.*compass_max_input_kb=1"):
        dag.apply_async()


def test_a_node_of_another_dag_is_refused_by_name(eager):
    one, two = Dag(eager, "one"), Dag(eager, "two")
    x1 = one.node("x", eager.tasks["b.src"].s(1))
    two.node("x", eager.tasks["b.src"].s(2))
    with pytest.raises(DagValidationError, match=r"DAG 'two'.*node 'x' of DAG 'one'"):
        two.node("y", eager.tasks["b.src"].s(3), after=[x1])
    two.node("z", eager.tasks["b.src"].s(4))
    with pytest.raises(DagValidationError, match=r"DAG 'two'.*node 'x' of DAG 'one'"):
        two.edge(x1, "z")
    assert "y" not in two.nodes and two.nodes["z"].preds == []
