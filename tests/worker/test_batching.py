"""Batched tasks with real workers: one run over every waiting input, each caller its own
result or its own failure, nothing lost or run twice when the worker dies mid-batch."""

from __future__ import annotations

import json
import time

import pytest
import redis

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.needs import TaskDeclarationError, batch_profile_key, resolve_needs
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_started
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "big,small"]


def _cluster(url, compass_workers, names, env=None):
    env = {"COMPASS_BROKER_URL": url, **(env or {})}
    ws = [compass_workers("tests.support.jobapp", n, *GPU, env=env) for n in names]
    app = make_app(url, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers)
                   == len(names), 30, "the workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None
    app.log = redis.Redis.from_url(url)
    return app, ws


def _batches(app) -> list[int]:
    return [int(x) for x in app.log.lrange("batches", 0, -1)]


def test_waiting_inputs_run_as_one_batch_and_each_caller_gets_its_own(compass_redis_url,
                                                                        compass_workers):
    app, ws = _cluster(compass_redis_url, compass_workers, ["b1@batch"])
    embed = app.tasks["j.embed"]
    busy = app.tasks["j.wait"].delay(0, 1.0)  # the worker is busy: the inputs queue up
    wait_started(app, busy)
    results = [embed.delay(f"t{i}") for i in range(6)] + [embed.delay("bad")]
    busy.get(timeout=20)
    assert [r.get(timeout=20) for r in results[:6]] == [f"e(t{i})" for i in range(6)]
    with pytest.raises(ValueError, match="bad input 'bad'"):  # its own failure alone
        results[6].get(timeout=20)
    assert sum(_batches(app)) == 7 and max(_batches(app)) >= 4, _batches(app)
    assert all(int(app.log.hget("execs", f"embed:t{i}")) == 1 for i in range(6))
    # each member's charge came off the backlog, and nothing is left in flight
    wait_until(lambda: app.compass.store.snapshot(time.time(), 3.0).workers[0].backlog_ms
               < 1, 10, "the backlog to settle")
    # the ack follows the end that releases the backlog: wait for it, briefly (a leaked
    # in-flight entry stays there until the visibility timeout, a minute)
    wait_until(lambda: app.log.hlen("unacked") == 0, 10, "every message acked")
    # the batch sizes are on the worker's inspect stats (Flower's worker page)
    stats = wait_until(lambda: app.control.inspect(destination=["b1@batch"],
                                                   timeout=2.0).stats(), 20, "a stats reply")
    sizes = dict(p.split(" x") for p in stats["b1@batch"]["compass_batches"].split(", "))
    assert sum(int(n) * int(k) for n, k in sizes.items()) == 7, sizes


def test_an_idle_worker_runs_one_input_at_once(compass_redis_url, compass_workers):
    app, ws = _cluster(compass_redis_url, compass_workers, ["b2@batch"])
    t0 = time.monotonic()
    assert app.tasks["j.embed"].delay("solo").get(timeout=20) == "e(solo)"
    assert time.monotonic() - t0 < 1.5 and _batches(app) == [1]


def test_a_body_that_raises_runs_each_input_alone(compass_redis_url, compass_workers):
    app, ws = _cluster(compass_redis_url, compass_workers, ["b3@batch"])
    embed = app.tasks["j.embed"]
    busy = app.tasks["j.wait"].delay(0, 1.0)
    wait_started(app, busy)
    rs = [embed.delay("a"), embed.delay("boom"), embed.delay("c")]
    busy.get(timeout=20)
    assert rs[0].get(timeout=20) == "e(a)" and rs[2].get(timeout=20) == "e(c)"
    with pytest.raises(RuntimeError, match="boom"):
        rs[1].get(timeout=20)


def test_a_batched_dag_node_completes_its_job(compass_redis_url, compass_workers):
    app, ws = _cluster(compass_redis_url, compass_workers, ["b4@batch"])
    busy = app.tasks["j.wait"].delay(0, 1.0)
    wait_started(app, busy)
    jobs = []
    for i in range(4):
        dag = Dag(app, f"emb{i}")
        a = dag.node("a", app.tasks["j.src"].s(f"q{i}"))
        dag.node("e", app.tasks["j.embed"].s(), after=[a])
        jobs.append(dag.apply_async())
    busy.get(timeout=20)
    assert [j.get(timeout=30) for j in jobs] == [{"e": f"e(q{i})"} for i in range(4)]


def test_a_worker_killed_mid_batch_loses_nothing(compass_redis_url, compass_workers):
    app, ws = _cluster(compass_redis_url, compass_workers, ["k1@batch", "k2@batch"],
                       env={"COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "2.0"})
    slow = app.tasks["j.embed_slow"]
    # everything to the one worker that holds it: pin by queue
    queue = app.compass.destination(app.compass.queue_for("k1@batch"))
    busy = app.tasks["j.wait"].apply_async((0, 1.0), queue=queue)
    wait_started(app, busy)
    rs = [slow.apply_async((f"x{i}",), queue=queue) for i in range(5)]
    wait_until(lambda: (b := _batches(app)) and sum(
        app.log.hexists("execs", f"embed:x{i}") for i in range(5)) >= b[0], 20,
        "the first batch's members to run")  # then 3 s of body: a kill now is mid-batch
    ws[0].kill()  # mid-batch: its members are in flight, leased by a dead worker
    assert [r.get(timeout=60) for r in rs] == [f"e(x{i})" for i in range(5)], worker_logs(ws)
    del busy


def test_sigterm_with_a_half_formed_batch_queued_loses_nothing(compass_redis_url,
                                                              compass_workers):
    """A deploy stops a worker mid-batch with more inputs queued: the running batch ends
    and is acked, the queued inputs are handed back, and every input runs once."""
    import signal

    app, ws = _cluster(compass_redis_url, compass_workers, ["t1@batch", "t2@batch"])
    slow = app.tasks["j.embed_slow"]
    queue = app.compass.destination(app.compass.queue_for("t1@batch"))
    rs = [slow.apply_async((f"y{i}",), queue=queue) for i in range(3)]
    wait_until(lambda: len(_batches(app)) >= 1, 20, "the first batch to start")
    rs += [slow.apply_async((f"y{i}",), queue=queue) for i in range(3, 6)]  # half-formed
    ws[0].kill(signal.SIGTERM)  # warm shutdown
    assert [r.get(timeout=60) for r in rs] == [f"e(y{i})" for i in range(6)], worker_logs(ws)
    assert all(int(app.log.hget("execs", f"embed:y{i}")) == 1 for i in range(6))


def test_redis_paused_during_a_batch_loses_nothing(compass_redis_server, compass_redis_url,
                                                   compass_workers):
    """Redis freezes while a batch runs: its members' results are stored and acked once
    it is back, each input once."""
    import os
    import signal

    app, ws = _cluster(compass_redis_url, compass_workers, ["p1@batch"])
    slow = app.tasks["j.embed_slow"]
    busy = app.tasks["j.wait"].delay(0, 1.0)
    wait_started(app, busy)
    rs = [slow.delay(f"z{i}") for i in range(4)]
    wait_until(lambda: len(_batches(app)) >= 1, 20, "the batch to start")
    os.kill(compass_redis_server.proc.pid, signal.SIGSTOP)
    try:
        # the outage's length is the test's subject: longer than the batch's 3 s body,
        # so the batch ends while Redis is frozen (nothing to wait on while it is)
        time.sleep(4.0)
    finally:
        os.kill(compass_redis_server.proc.pid, signal.SIGCONT)
    assert [r.get(timeout=60) for r in rs] == [f"e(z{i})" for i in range(4)], worker_logs(ws)
    assert all(int(app.log.hget("execs", f"embed:z{i}")) == 1 for i in range(4))
    assert busy.get(timeout=20) == 0


def test_batched_calls_take_one_input_each(compass_redis_url):
    app = make_app(compass_redis_url)
    with pytest.raises(TaskDeclarationError, match="send one input per call"):
        app.tasks["j.embed"].delay("a", "b")


def test_eager_mode_runs_a_batch_of_one():
    """No Redis at all, as a Django or Flask unit test runs: a batch of one per call."""
    from celery import Celery

    from compass_celery import Compass

    app = Celery("eager_batch")
    app.conf.update(task_always_eager=True, compass_models={"embedder": 100})
    Compass(app)
    seen = []

    @app.task(name="eb.embed", shared=False, compass_model="embedder", compass_exec_ms=5,
              compass_batch={"max_size": 16, "max_wait_ms": 5})
    def embed(texts: list[str]) -> list[object]:
        seen.append(len(texts))
        return [ValueError("empty") if not t else t.upper() for t in texts]

    assert embed.delay("hi").get() == "HI" and seen == [1]
    with pytest.raises(ValueError, match="empty"):
        embed.delay("").get()
    with pytest.raises(TaskDeclarationError, match="send one input per call"):
        embed.delay("a", "b")


def test_a_worker_learns_a_batched_tasks_cost_curve(compass_redis_url, compass_workers):
    """Nothing declared: the planner's curve comes from the passes measured, so joining a
    forming batch is charged what one more input adds (20 ms), not a whole run (100)."""
    app, ws = _cluster(compass_redis_url, compass_workers, ["b9@batch"])
    embed, wait = app.tasks["j.embed_curve"], app.tasks["j.wait"]
    for size in (1, 6, 1, 3, 8, 1, 5, 2):
        busy = wait.delay(0, 0.4)  # the worker is busy: ``size`` inputs queue up
        wait_started(app, busy)
        results = [embed.delay(f"x{size}-{i}") for i in range(size)]
        busy.get(timeout=20)
        assert [r.get(timeout=20) for r in results] == [f"e(x{size}-{i})"
                                                       for i in range(size)]
    assert len(set(_batches(app))) >= 4, _batches(app)
    profiles = wait_until(
        lambda: (p := app.compass.reader.get().profiles)
        and batch_profile_key("j.embed_curve", "small") in p and p, 10, "a learned curve")
    needs = resolve_needs("j.embed_curve", embed, None, profiles, 100.0)
    curve = needs.batch.curve
    assert curve is not None, profiles
    assert 60 <= curve.base_ms <= 160, curve
    assert 8 <= curve.per_item_ms <= 40, curve
    assert needs.exec_ms == curve.base_ms  # blind placement charges a whole single run
    # a Dag node of the task is planned, and recorded for its re-placement, on that curve
    dag = Dag(app, "curve")
    dag.node("e", embed.s("d"))
    job = dag.apply_async()
    assert job.get(timeout=20) == {"e": "e(d)"}
    node = json.loads(app.log.hget(job.keys.job, "n:e"))
    assert node["batch"]["per_item_ms"] == pytest.approx(curve.per_item_ms, rel=0.5)
    assert node["batch"]["base_ms"] == pytest.approx(curve.base_ms, rel=0.5)
