"""Re-placement keeps the task whole, with real processes: a warm shutdown's hand-back, a
dead worker's drain and a same-name restart's take-back move a task to another worker and
redo only where it runs; its level, age, SLO class, due time, latest start and batch key
(``placement.CARRIED``) arrive unchanged, and its run time is planned at speed 1.0 again,
so a worker's speed is applied once on a cluster of mixed speeds."""

from __future__ import annotations

import json
import signal

import pytest

from compass_celery.local import wait_until
from compass_celery.placement import CARRIED, Decision
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, executions, start, wait_live

pytestmark = pytest.mark.redis

FAST, SLOW = "2.0", "1.0"  # the first worker runs twice as fast as the second
EXEC_MS = 300.0  # j.seen's declared run time at speed 1.0


def _seen(app) -> dict[str, dict]:
    """Task id -> where it ran and the compass header it ran with (its last run)."""
    return {e["id"]: e for e in map(json.loads, app.log.lrange("seen", 0, -1))}


def _queue_on_the_fast_worker(url, compass_workers, name: str):
    """A fast worker alone, holding 8 urgent tasks with a deadline; then a slow second
    worker joins. -> (app, workers, results, the decisions made when they were sent)."""
    app, ws = start(url, compass_workers, [name], extra_args=["--compass-speed", FAST])
    task = app.tasks["j.seen"]
    # 750 ms each here: most still wait when the second worker is up
    results = [task.apply_async((i, 1500), priority="interactive",
                                compass={"deadline_ms": 120_000}) for i in range(8)]
    sent = {r.id: app.compass.placement(r.id) for r in results}
    assert {d.worker for d in sent.values()} == {name}
    assert all(d.due and d.expires_at and d.priority == 9 for d in sent.values()), sent
    # planned on the fast worker: its speed applied once
    assert {d.run_ms for d in sent.values()} == {EXEC_MS / float(FAST)}
    wait_until(lambda: executions(app), 15, "the first task to start")
    ws.append(compass_workers("tests.support.jobapp", f"slow-{name}", *GPU,
                              "--compass-speed", SLOW,
                              env={"COMPASS_BROKER_URL": url,
                                   "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}))
    wait_live(app, 2, ws)
    return app, ws, results, sent


def _assert_kept_whole(app, ws, results, sent, moved_to: str) -> None:
    assert sorted(r.get(timeout=60) for r in results) == list(range(8)), worker_logs(ws)
    seen = _seen(app)
    moved = [tid for tid, e in seen.items() if e["host"] == moved_to]
    assert moved, f"no task was re-placed on {moved_to}: {worker_logs(ws)}"
    for tid in moved:
        header = seen[tid]["compass"]
        kept = Decision.from_header(header)
        assert kept is not None, header
        assert kept.worker == moved_to
        before = sent[tid]
        for name in CARRIED:
            assert getattr(kept, name) == getattr(before, name), (name, header)
        # re-planned from the speed-1.0 run time on the slow worker: 300 ms, not 150 / 1
        assert kept.exec_ms == EXEC_MS
        assert kept.run_ms == EXEC_MS / float(SLOW), header


def test_hand_back_keeps_every_task_field(compass_redis_url, compass_workers):
    app, ws, results, sent = _queue_on_the_fast_worker(compass_redis_url, compass_workers,
                                                       "fast@handback")
    ws[0].kill(signal.SIGTERM)  # a warm shutdown hands its waiting tasks back
    _assert_kept_whole(app, ws, results, sent, "slow-fast@handback")
    assert "handed back" in ws[0].log(), worker_logs(ws)


def test_drain_of_a_killed_worker_keeps_every_task_field(compass_redis_url, compass_workers):
    app, ws, results, sent = _queue_on_the_fast_worker(compass_redis_url, compass_workers,
                                                       "fast@drain")
    ws[0].kill()  # SIGKILL: the leader drains its queue once its heartbeat lapses
    _assert_kept_whole(app, ws, results, sent, "slow-fast@drain")


def test_restart_take_back_keeps_every_task_field(compass_redis_url, compass_workers):
    app, ws, results, sent = _queue_on_the_fast_worker(compass_redis_url, compass_workers,
                                                       "fast@restart")
    ws[0].kill()  # SIGKILL, then a new process under the same name takes its work back
    ws.append(compass_workers("tests.support.jobapp", "fast@restart", *GPU,
                              "--compass-speed", FAST,
                              env={"COMPASS_BROKER_URL": compass_redis_url,
                                   "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}))
    _assert_kept_whole(app, ws, results, sent, "slow-fast@restart")


def test_retry_keeps_every_task_field(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["a@retry", "b@retry"])
    res = app.tasks["j.flaky"].apply_async(("x",), priority="interactive",
                                           compass={"deadline_ms": 120_000})
    sent = app.compass.placement(res.id)
    assert sent.due and sent.priority == 9
    assert res.get(timeout=30) == "x", worker_logs(ws)
    tries = [json.loads(e)["compass"] for e in app.log.lrange("seen", 0, -1)]
    assert len(tries) == 3, tries
    assert tries[0]["worker"] != tries[1]["worker"], "the retry should be re-placed"
    for header in tries:
        kept = Decision.from_header(header)
        for name in CARRIED:
            assert getattr(kept, name) == getattr(sent, name), (name, header)


def test_a_task_reads_back_the_priority_it_was_sent_with(compass_redis_url, compass_workers):
    """On Redis the broker needs the mirror image of a level (it serves 0 first): the task
    still reads the level it was sent with, and so does its retry."""
    app, ws = start(compass_redis_url, compass_workers, ["p@prio"])
    task = app.tasks["j.prio"]
    assert task.apply_async(priority=3).get(timeout=20) == 3, worker_logs(ws)
    assert task.apply_async(priority="interactive").get(timeout=20) == 9
    assert task.apply_async((True,), priority=2).get(timeout=20) == 2
    assert app.log.lrange("prio", 0, -1)[-2:] == [b"2", b"2"]  # the first run and its retry


def test_a_batched_input_keeps_its_batch_key_and_joins_a_batch_elsewhere(compass_redis_url):
    """A batched task's input re-placed (as a hand-back, a drain or a take-back does it, by
    ``plan_message``, against real state) keeps its batch key and every task field, and its
    routing key names its new worker's queue."""
    import time as _time

    from compass_celery.planner.types import WorkerView
    from compass_celery.worker.recovery import plan_message
    from tests.support.jobapp import make_app

    app = make_app(compass_redis_url, compass_key_prefix="rebatch",
                   compass_heartbeat_timeout_s=3600.0, compass_snapshot_ttl_s=0.0)
    c = app.compass
    for name in ("old@rebatch", "new@rebatch"):
        c.store.publish(WorkerView(name=name, queue=c.queue_for(name), gpu_total_mb=4000,
                                   gpu_free_mb=3000, resident=frozenset({"small"}),
                                   heartbeat=_time.time()))
    old = Decision(task="j.embed", model="small", worker="old@rebatch",
                   queue=c.queue_for("old@rebatch"), policy="compass", charge_ms=20.0,
                   run_ms=20.0, exec_ms=20.0, priority=9, queued_at=123.0, slo="interactive",
                   due=_time.time() + 60, expires_at=_time.time() + 59,
                   batch="j.embed|small")
    message = {"headers": {"task": "j.embed", "id": "t1", "compass": old.as_header()},
               "properties": {"delivery_info": {"routing_key": old.queue}}}
    queue, placed = plan_message(c, message, exclude="old@rebatch")
    assert placed is not None and placed.worker == "new@rebatch" and queue == placed.queue
    kept = Decision.from_header(message["headers"]["compass"])
    assert kept == placed
    for name in CARRIED:
        assert getattr(kept, name) == getattr(old, name), name
    assert message["properties"]["delivery_info"]["routing_key"] == queue
