"""DAGs in eager mode: inline, topological order, same results and a recorded plan."""

from __future__ import annotations

import pytest
from celery import Celery

from compass_celery import Compass
from compass_celery.dag_validation import DagValidationError
from compass_celery.jobs import JobFailed
from compass_celery.jobs.dag import Dag
from compass_celery.testing import add_worker


@pytest.fixture
def app():
    app = Celery("eagerdag")
    app.conf.task_always_eager = True
    app.conf.compass_models = {"small": 50, "big": 3000}
    Compass(app)

    @app.task(name="e.src", shared=False, compass_model="small", compass_exec_ms=5)
    def src(x):
        return x

    @app.task(name="e.add", shared=False, compass_model="small", compass_exec_ms=5)
    def add(inp, k):
        return inp + k

    @app.task(name="e.collect", shared=False, compass_model="big", compass_exec_ms=5)
    def collect(inputs):
        return list(inputs)

    @app.task(name="e.boom", shared=False)
    def boom(inp):
        raise ValueError("middle failed")

    add_worker(app, "g0", gpu_mb=4000, resident=["small", "big"])
    add_worker(app, "g1", gpu_mb=4000, resident=["small"])
    return app


def test_eager_diamond_same_results_as_redis_mode(app):
    dag = Dag(app, "diamond")
    a = dag.node("a", app.tasks["e.src"].s(10))
    b = dag.node("b", app.tasks["e.add"].s(1), after=[a])
    c = dag.node("c", app.tasks["e.add"].s(2), after=[a])
    e = dag.node("e", app.tasks["e.add"].s(3), after=[a])
    dag.node("d", app.tasks["e.collect"].s(), after=[e, b, c])
    job = dag.apply_async()
    assert job.get() == {"d": [13, 11, 12]}
    plan = job.placement()
    assert set(plan) == {"a", "b", "c", "d", "e"}
    assert plan["d"]["planned"] == "g0"  # only g0 holds "big"


def test_eager_failure_names_node_and_stops(app):
    dag = Dag(app, "failing")
    a = dag.node("a", app.tasks["e.src"].s(1))
    b = dag.node("b", app.tasks["e.boom"].s(), after=[a])
    dag.node("c", app.tasks["e.add"].s(1), after=[b])
    job = dag.apply_async()
    with pytest.raises(JobFailed, match="node 'b'.*ValueError: middle failed"):
        job.get()
    assert "c" not in job.results


@pytest.mark.parametrize("build, message", [
    (lambda d, t: (d.node("a", t["e.src"].s(1)), d.node("a", t["e.src"].s(2))),
     "duplicate node name 'a'"),
    (lambda d, t: (d.node("a", t["e.src"].s(1)), d.edge("a", "zz")), "missing node 'zz'"),
    (lambda d, t: d.node("a", t["e.src"].s(1), model="unknown-model").__class__ and
     d.spec(), "unknown-model"),
    (lambda d, t: d.node("a", "not a signature"), "needs a Celery signature"),
    (lambda d, t: d.node("a", t["e.src"].s(1), exec_ms=-3), "exec_ms must be >= 0"),
])
def test_malformed_dags_are_named(app, build, message):
    with pytest.raises(DagValidationError, match=message):
        build(Dag(app, "bad"), app.tasks)


def test_cycle_is_named(app):
    dag = Dag(app, "cyclic")
    dag.node("a", app.tasks["e.src"].s(1))
    dag.node("b", app.tasks["e.add"].s(1), after=["a"])
    with pytest.raises(DagValidationError, match="'b' -> 'a' would close a cycle"):
        dag.edge("b", "a")  # refused where it is made, not at apply_async


def test_unknown_task_is_named(app):
    with pytest.raises(DagValidationError, match="unknown task 'no.such'"):
        Dag(app, "x").node("a", app.signature("no.such"))


def test_dag_size_limit(app):
    app.conf.compass_max_dag_nodes = 3
    app.compass.__dict__.pop("settings", None)
    dag = Dag(app, "big")
    for i in range(4):
        dag.node(f"n{i}", app.tasks["e.src"].s(i))
    with pytest.raises(DagValidationError, match="more than 3"):
        dag.apply_async()


def test_a_workers_output_cache_lets_go_of_ended_and_old_outputs(monkeypatch):
    """Outputs kept for collocated successors go when their job ends here, and once too
    old for a successor to want them, so the cache empties when the load stops."""
    import time as _time

    from compass_celery.jobs.runtime import OutputCache

    clock = [100.0]
    monkeypatch.setattr(_time, "monotonic", lambda: clock[0])
    cache = OutputCache(capacity_bytes=10_000, max_age_s=60.0)
    cache.put("j1", "a", "x", 10)
    cache.put("j1", "b", "y", 10)
    cache.put("j2", "a", "z", 10)
    cache.drop_job("j1")
    assert cache.get("j1", "a") == (False, None) and cache.get("j2", "a") == (True, "z")
    assert cache.bytes == 10
    clock[0] += 61.0
    cache.put("j3", "a", "w", 10)  # the next put expires what is too old
    assert cache.get("j2", "a") == (False, None) and cache.bytes == 10
