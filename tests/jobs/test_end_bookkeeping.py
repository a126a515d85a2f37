"""A node's end bookkeeping (its charge off the backlog, its run time learned) rides its
completion's round trip: a node whose completion releases no successor costs the worker
one round trip between its end and its ack, not two."""

from __future__ import annotations

import json

import redis

from compass_celery.jobs.dag import Dag
from tests.support.jobapp import make_app


def _round_trips(client, fn):
    """Run ``fn`` and count the connections ``client``'s pool handed out meanwhile (one
    a command or a pipeline run: its round trips)."""
    pool = client.connection_pool
    taken = []
    get = pool.get_connection

    def counting(*args, **kwargs):
        taken.append(1)
        return get(*args, **kwargs)

    pool.get_connection = counting
    try:
        return fn(), len(taken)
    finally:
        pool.get_connection = get


def test_a_completion_runs_the_callers_bookkeeping_in_its_own_round_trip(compass_redis_url):
    """The worker's end bookkeeping queued on ``pipe`` runs with complete.lua, in one round
    trip: the job finishes, the bookkeeping is written, the deadline is forgotten once the
    caller runs what the completion left on the pipe. A retried completion (its first try
    lost) does not write the bookkeeping twice."""
    from compass_celery.jobs.runtime import JobRuntime
    from compass_celery.state.scripts import script

    app = make_app(compass_redis_url, compass_key_prefix="endrt")
    dag = Dag(app, "one")
    dag.node("a", app.tasks["j.src"].s(1))
    handle = dag.apply_async()
    jobs = JobRuntime(app.compass, "w@endrt")
    client = app.compass.store.client
    log = redis.Redis.from_url(compass_redis_url)
    log.script_load(script("complete"))  # as a worker's first completion left it
    pipe = client.pipeline(transaction=False)
    pipe.incr("endrt:mark")  # the caller's bookkeeping (ledger.ended, the run time learned)
    job = {"id": handle.id, "node": "a"}
    sent, trips = _round_trips(client, lambda: jobs.on_success(
        job, f"{handle.id}.a", 1, {"run_ms": 5.0, "finished": 0.0}, pipe,
        task="j.src"))
    assert sent == []
    assert log.hget(jobs.keys(handle.id).job, "state") == b"SUCCESS"
    assert log.get("endrt:mark") == b"1"  # written with the completion
    assert trips == 1
    app.compass.store.execute(pipe)  # what the completion left: its deadline forgotten
    assert log.get("endrt:mark") == b"1"
    # a duplicate (the first try's reply lost) runs on an empty pipe: nothing twice
    again = client.pipeline(transaction=False)
    jobs.on_success(job, f"{handle.id}.a", 1, {"run_ms": 5.0}, again, task="j.src")
    assert log.get("endrt:mark") == b"1"
    assert json.loads(log.hget(jobs.keys(handle.id).outputs, "a")) == 1
