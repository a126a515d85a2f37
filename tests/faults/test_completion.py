"""Jobs under faults with real processes: completion outlasts Redis; nothing is left unended."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import JobKeys
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import start

pytestmark = pytest.mark.redis


def _ran(app) -> Counter[str]:
    return Counter(e.decode().rsplit(":", 1)[0] for e in app.log.lrange("ran", 0, -1))


def test_a_completion_that_cannot_reach_redis_past_its_old_retries_still_releases(
        compass_redis_server, compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["o0@outage"])
    dag = Dag(app, "outage")
    a = dag.node("a", app.tasks["j.wait_nr"].s(5, 1.5))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async()
    wait_until(lambda: _ran(app)[f"{job.id}:a"] == 1, 15, "node a to start")
    os.kill(compass_redis_server.proc.pid, signal.SIGSTOP)
    try:  # a finishes meanwhile; its completion keeps failing for 16 s (it gave up at ~13 s)
        time.sleep(16)  # the outage's length is the test's subject
    finally:
        os.kill(compass_redis_server.proc.pid, signal.SIGCONT)
    assert job.get(timeout=40) == {"b": 6}, worker_logs(ws)
    assert _ran(app)[f"{job.id}:b"] == 1
    assert "retrying" in ws[0].log()


def test_a_job_nobody_waits_on_still_ends_and_expires(compass_redis_url, compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["n0@sweep"])
    dag = Dag(app, "abandoned")
    a = dag.node("a", app.tasks["j.wait"].s(1, 4.0))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async(timeout_s=1.0)  # nobody calls get(): the sweeper must end it
    wait_until(lambda: job.status == "FAILURE", 15, "the overdue job to be failed")
    assert "deadline passed" in job.error["exc"]
    keys = JobKeys.of("compass", job.id)
    assert all(app.log.ttl(k) > 0 for k in (keys.job, keys.done))
    wait_until(lambda: app.log.zscore("{compass}:jobs:deadlines", job.id) is None, 5,
               "the sweeper to forget the ended job")
    assert job.get(timeout=1, propagate=False) == {}
    assert app.log.ttl(keys.done) > 0  # waiting did not recreate it without a TTL


def test_a_sender_dying_between_claim_and_publish_is_resumed(compass_redis_url,
                                                            compass_workers):
    app, ws = start(compass_redis_url, compass_workers, ["m0@claim"])
    dag = Dag(app, "claim")
    a = dag.node("a", app.tasks["j.src"].s(5))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async()
    assert job.get(timeout=20) == {"b": 6}
    keys = JobKeys.of("compass", job.id)
    # as if b had been claimed by a sender that died before publishing it
    app.log.hset(keys.job, "state", "RUNNING")
    app.log.hset(keys.tasks, "b", "?deadbeef")
    app.log.hdel(keys.outputs, "b")
    app.log.hincrby(keys.job, "ndone", -1)
    # a's message redelivered (the sender died before its ack): it runs again, and its
    # duplicate completion re-sends b under the claimed id
    app.send_task("j.src", args=[5], queue=app.compass.queue_for("m0@claim"),
                  headers={"compass_job": {"id": job.id, "node": "a"}})
    wait_until(lambda: job.status == "SUCCESS", 20, "b to be re-sent and finish")
    assert app.log.hget(keys.tasks, "b") == b"deadbeef"
    assert "never confirmed sent" in ws[0].log()


def test_a_submission_during_a_redis_pause_waits_instead_of_failing(
        compass_redis_server, compass_redis_url, compass_workers):
    import threading

    app, ws = start(compass_redis_url, compass_workers, ["s0@submit"])
    pid = compass_redis_server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(3.0, os.kill, (pid, signal.SIGCONT)).start()
    dag = Dag(app, "paused")
    a = dag.node("a", app.tasks["j.src"].s(2))
    dag.node("b", app.tasks["j.add"].s(3), after=[a])
    started = time.monotonic()
    job = dag.apply_async()  # Redis is frozen for 3 s: the submission retries
    assert time.monotonic() - started >= 2.0
    assert job.get(timeout=30) == {"b": 5}, worker_logs(ws)
    assert _ran(app)[f"{job.id}:a"] == 1 and _ran(app)[f"{job.id}:b"] == 1
