"""A job node's receipt check reads its job's state in the fetch that takes the node
(the job records live in the broker's Redis): no round trip of its own between a busy
worker's tasks, and a job failed since the node was sent is seen, however recent the
send."""

from __future__ import annotations

import signal
import time

import redis

from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import JobKeys
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import wait_live
from tests.support.jobapp import make_app

GPU = ["--compass-emulate-gpu-mb", "4000"]


def test_a_node_of_a_job_failed_since_its_send_is_not_run(compass_redis_url,
                                                           compass_workers):
    """A node sent moments ago, whose job failed elsewhere before the worker took it, is
    dropped at its receipt: the fetch read the failure with the node (the check no
    longer trusts a recent send without asking), and a node of a running job still runs."""
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    worker = compass_workers("tests.support.jobapp", "r@recv", *GPU, "--compass-preload",
                             "small", env=env)
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    wait_live(app, 1, [worker])
    log = redis.Redis.from_url(compass_redis_url)
    first = Dag(app, "runs")
    first.node("a", app.tasks["j.src"].s(1))
    assert first.apply_async().get(timeout=30) == {"a": 1}  # the worker runs job nodes
    worker.kill(signal.SIGSTOP)  # it takes nothing until the job below has failed
    # an idle worker's wait (BRPOP) and its look behind it were sent before the stop, and
    # Redis runs that look as soon as the wait ends, stopped client or not: let the wait
    # time out (kombu's 1 s) and its look find nothing, so the look that takes the node
    # runs after the failure below
    time.sleep(1.5)
    try:
        dag = Dag(app, "failed")
        dag.node("a", app.tasks["j.src"].s(2))
        job = dag.apply_async()
        log.hset(JobKeys.of("compass", job.id).job, "state", "FAILURE")  # failed elsewhere
    finally:
        worker.kill(signal.SIGCONT)

    def ran() -> bool:
        return any(e.decode().startswith(f"{job.id}:") for e in log.lrange("ran", 0, -1))

    wait_until(lambda: ran() or "not running its node" in worker.log(), 20,
               "the node taken")
    assert not ran(), worker_logs([worker])
    again = Dag(app, "after")
    again.node("a", app.tasks["j.src"].s(3))
    assert again.apply_async().get(timeout=30) == {"a": 3}
