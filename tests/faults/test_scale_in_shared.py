"""A scale-in's hand-back and the shared queue, with real worker processes: what reaches
the shared queue around a drain (handed back, restored, or pushed with no token) is run
by a worker that stays, within seconds, whatever its priority list; and a worker that
reads a JSON scalar off a queue keeps consuming (one that stopped would hand its queue
to the shared one, where nobody is left to take it)."""

from __future__ import annotations

import threading
import time

import pytest

from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import executions, start, wait_started

pytestmark = pytest.mark.redis


def _all_done(app, results, timeout, ws) -> None:
    try:
        wait_until(lambda: all(r.ready() for r in results), timeout,
                   f"{len(results)} tasks to finish")
    except TimeoutError:
        left = {k.decode(errors="replace"): app.log.llen(k)
                for k in app.log.scan_iter("compass.*") if app.log.type(k) == b"list"}
        raise AssertionError(f"{sum(not r.ready() for r in results)} unfinished; lists "
                             f"{left}\n" + worker_logs(ws)[-6000:]) from None


def test_messages_pushed_to_the_shared_queue_without_a_token_are_run(compass_redis_url,
                                                                      compass_workers):
    """Both priority lists of the shared queue, filled by hand (no bell rung), while the
    worker idles: it runs them all (a look after each BRPOP timeout)."""
    app, ws = start(compass_redis_url, compass_workers, ["i0@shared"])
    client, shared = app.log, app.compass.shared_queue
    time.sleep(1.5)  # idle: blocked on the bells
    results = []
    for i in range(20):
        r = app.send_task("j.src", args=[i], queue="compass.nobody",
                          priority=9 if i % 2 else 0)
        results.append(r)
    for key in client.scan_iter("compass.nobody*"):
        name = key.decode()
        target = shared + name[len("compass.nobody"):]
        while (raw := client.rpop(key)) is not None:
            client.lpush(target, raw)
    bells = list(client.scan_iter("*bell*"))
    if bells:
        client.delete(*bells)
    _all_done(app, results, 15, ws)


def test_two_workers_drained_at_once_leave_nothing_for_the_one_that_stays(
        compass_redis_url, compass_workers):
    """Two of three workers SIGTERMed together, each with a backlog at priorities 0 and 9
    behind a running task, while the third idles: every task runs, once, on the third."""
    names = ["d0@scale", "d1@scale", "d2@scale"]
    app, ws = start(compass_redis_url, compass_workers, names)
    results, running = [], []
    for name in names[:2]:
        q = app.compass.queue_for(name)
        first = app.send_task("j.wait", args=[0, 2.0], queue=q)
        running.append(first)
        results.append(first)
    wait_started(app, *running)
    for name in names[:2]:
        q = app.compass.queue_for(name)
        for i in range(15):
            results.append(app.send_task("j.wait", args=[i, 0.05], queue=q,
                                         priority=9 if i % 2 else 0))
        for i in range(5):
            results.append(app.send_task("j.wait", args=[i, 0.05],
                                         queue=app.compass.shared_queue,
                                         priority=9 if i % 2 else 0))
    stops = [threading.Thread(target=w.stop, args=(60,)) for w in ws[:2]]
    for t in stops:
        t.start()
    for t in stops:
        t.join()
    _all_done(app, results, 30, ws)
    runs = executions(app)
    assert all(runs[r.id] == 1 for r in results), runs


def test_work_sent_while_the_only_worker_looks_dead_is_run_when_it_resumes(
        compass_redis_url, compass_workers):
    """The only worker frozen (SIGSTOP) past its heartbeat timeout, as an overloaded host
    can: what producers send meanwhile goes to the shared queue (no live worker known),
    at both priorities; resumed, the worker runs it all within seconds."""
    import os
    import signal

    app, ws = start(compass_redis_url, compass_workers, ["f0@frozen"])
    time.sleep(1.5)  # idle: blocked on the bells
    pid = ws[0].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)  # past the 1 s heartbeat timeout
        results = [app.send_task("j.src", args=[i], priority=9 if i % 2 else 0)
                   for i in range(20)]
        shared = app.compass.shared_queue
        assert all(app.compass.placement(r.id).queue == shared for r in results)
        time.sleep(11)  # the bell's tokens expire
    finally:
        os.kill(pid, signal.SIGCONT)
    _all_done(app, results, 15, ws)


def test_the_autoscaled_audit_names_a_worker_that_exited_undrained(compass_redis_url):
    """autoscale-real's audit tells a worker that died on its own (here SIGKILLed) from
    one still up: after it, the shared queue has no consumer left."""
    import signal

    from compass_celery.bench.autoscaled import exited_workers
    from compass_celery.providers import LocalProvider

    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}
    with LocalProvider("tests.support.jobapp", args=["--compass-emulate-gpu-mb", "4000"],
                       env=env, prefix="ex", host="audit") as provider:
        kept, gone = provider.add(), provider.add()
        assert exited_workers(provider) == {}
        provider.process(gone).kill(signal.SIGKILL)
        wait_until(lambda: not provider.process(gone).alive(), 10, f"{gone} to exit")
        assert exited_workers(provider) == {gone: -signal.SIGKILL}
        assert provider.process(kept).alive()


def test_a_json_scalar_in_a_queue_is_dead_lettered_and_the_worker_keeps_consuming(
        compass_redis_url, compass_workers):
    """A bell's token ("1") on the shared queue's list and a JSON string on the worker's
    own urgent list: kombu's Message cannot index either (a TypeError that stopped the
    worker, whose stop then sent everything after it to the shared queue, with no worker
    known). Both are kept in the dead-letter list; the worker stays and runs what
    follows, on its own queue."""
    app, ws = start(compass_redis_url, compass_workers, ["g0@garbage"])
    client, queues = app.log, app.compass.queues
    own = app.compass.queue_for("g0@garbage")
    time.sleep(1.5)  # idle: blocked on the bells
    client.lpush(app.compass.shared_queue, "1")
    client.lpush(queues.layout.list_for(own, 9), '"stray"')
    wait_until(lambda: client.llen(queues.dead_letter_key) == 2, 10,
               "both entries dead-lettered")
    r = app.send_task("j.src", args=[5])
    assert app.compass.placement(r.id).queue == own  # still live: placed on it
    assert r.get(timeout=10) == 5, worker_logs(ws)[-3000:]
    assert ws[0].alive()
