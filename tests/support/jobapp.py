"""Worker app for the job-runtime tests: small arithmetic tasks that log each run."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

from compass_celery import Compass
from compass_celery.cache import current_cache

BROKER = os.environ.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
MODELS = {"big": 3000.0, "small": 50.0}


def make_app(broker: str = BROKER, **conf: Any) -> Celery:
    app = Celery("jobapp", broker=broker, backend=broker)
    timeout = float(os.environ.get("COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S", "3.0"))
    app.conf.update(compass_models=MODELS, compass_state_refresh_s=0.05,
                    compass_heartbeat_timeout_s=timeout, compass_reconcile_s=1.0,
                    broker_connection_retry_on_startup=True, compass_validate=True)
    if os.environ.get("COMPASS_JOBAPP_SENTINEL_MASTER"):
        master = {"master_name": os.environ["COMPASS_JOBAPP_SENTINEL_MASTER"]}
        app.conf.broker_transport_options = master
        app.conf.result_backend_transport_options = master
    if os.environ.get("COMPASS_JOBAPP_STATE_URL"):  # compass state apart from the broker
        app.conf.compass_redis_url = os.environ["COMPASS_JOBAPP_STATE_URL"]
    if os.environ.get("COMPASS_JOBAPP_RESULT_URL"):  # results apart from the broker (AMQP)
        app.conf.result_backend = os.environ["COMPASS_JOBAPP_RESULT_URL"]
    if os.environ.get("COMPASS_JOBAPP_KEY_PREFIX"):
        app.conf.compass_key_prefix = os.environ["COMPASS_JOBAPP_KEY_PREFIX"]
    if os.environ.get("COMPASS_JOBAPP_VISIBILITY_TIMEOUT"):
        app.conf.broker_transport_options = {  # and kombu scans for them every second
            "visibility_timeout": float(os.environ["COMPASS_JOBAPP_VISIBILITY_TIMEOUT"]),
            "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
    if os.environ.get("COMPASS_JOBAPP_MAX_OUTPUT_KB"):
        app.conf.compass_max_output_kb = float(os.environ["COMPASS_JOBAPP_MAX_OUTPUT_KB"])
    if os.environ.get("COMPASS_JOBAPP_JOB_TTL_S"):  # short-lived job records (the soak)
        app.conf.compass_job_ttl_s = float(os.environ["COMPASS_JOBAPP_JOB_TTL_S"])
    if os.environ.get("COMPASS_JOBAPP_ATOMIC_FETCH"):  # no fetch window (the kill hunt)
        app.conf.compass_atomic_fetch = True
    if os.environ.get("COMPASS_JOBAPP_NO_MISSING_QUEUES"):  # Celery's own test config
        app.conf.task_create_missing_queues = False
    app.conf.update(conf)
    Compass(app)

    class _Log:  # the run log lives in the state Redis (also behind Sentinel or TLS)
        def rpush(self, key: str, value: str) -> None:
            app.compass.store.client.rpush(key, value)

        def executed(self, task_id: str) -> None:
            app.compass.store.client.hincrby("execs", task_id, 1)

    log = _Log()

    def ran(task: Any) -> None:
        log.executed(task.request.id)  # executions per task id: duplicates show as > 1
        job = getattr(task.request, "compass_job", None) or {}
        log.rpush("ran", f"{job.get('id')}:{job.get('node')}:{task.request.hostname}")

    @app.task(name="j.src", bind=True, shared=False, compass_model="small", compass_exec_ms=5)
    def src(self: Any, x: int) -> int:
        ran(self)
        return x

    @app.task(name="j.add", bind=True, shared=False, compass_model="small", compass_exec_ms=5)
    def add(self: Any, inp: int, k: int) -> int:
        ran(self)
        return inp + k

    @app.task(name="j.collect", bind=True, shared=False, compass_model="small",
              compass_exec_ms=5)
    def collect(self: Any, inputs: list[int]) -> list[int]:
        ran(self)
        return list(inputs)

    @app.task(name="j.sum1", bind=True, shared=False, compass_model="small", compass_exec_ms=2)
    def sum1(self: Any, inputs: Any = None) -> int:
        ran(self)
        if inputs is None:
            return 1
        return (sum(inputs) if isinstance(inputs, list) else inputs) + 1

    @app.task(name="j.boom", bind=True, shared=False, compass_model="small", compass_exec_ms=5)
    def boom(self: Any, inp: Any) -> None:
        ran(self)
        raise ValueError(f"boom on {inp}")

    @app.task(name="j.heavy", bind=True, shared=False, compass_model="big", compass_exec_ms=300)
    def heavy(self: Any, x: Any = None) -> Any:
        ran(self)
        current_cache().run(self.compass_exec_ms)
        return x

    def saw(task: Any) -> None:
        """Log the compass header ``task`` runs with (re-placement tests read it back)."""
        log.rpush("seen", json.dumps({"id": task.request.id, "host": task.request.hostname,
                                      "compass": getattr(task.request, "compass", None)}))

    @app.task(name="j.seen", bind=True, shared=False, compass_model="big", compass_exec_ms=300)
    def seen(self: Any, x: Any = None, ms: float = 300) -> Any:
        """Like j.heavy (running ``ms`` at speed 1.0), and logs the compass header it ran
        with (a re-placement's test)."""
        ran(self)
        saw(self)
        current_cache().run(ms)
        return x

    @app.task(name="j.prio", bind=True, shared=False, compass_model="small",
              compass_exec_ms=5, max_retries=1)
    def prio(self: Any, retry: bool = False) -> Any:
        """The priority this run reads in its delivery info; retried once if asked."""
        seen = (self.request.delivery_info or {}).get("priority")
        log.rpush("prio", str(seen))
        if retry and not self.request.retries:
            raise self.retry(countdown=0)
        return seen

    @app.task(name="j.slow", bind=True, shared=False, compass_model="big",
              compass_exec_ms=1000)
    def slow(self: Any) -> None:
        current_cache().run(1000)

    @app.task(name="j.light", bind=True, shared=False, compass_model="small",
              compass_exec_ms=100)
    def light(self: Any, inp: Any) -> Any:
        ran(self)
        current_cache().run(100)
        return inp

    @app.task(name="j.wait", bind=True, shared=False, compass_model="small", compass_exec_ms=5)
    def wait(self: Any, inp: Any, seconds: float) -> Any:
        ran(self)
        time.sleep(seconds)
        return inp

    @app.task(name="j.wait_nr", bind=True, shared=False, compass_model="small",
              compass_exec_ms=5, ignore_result=True)
    def wait_nr(self: Any, inp: Any, seconds: float) -> Any:
        ran(self)  # no result backend write: only the job completion needs Redis after
        time.sleep(seconds)
        return inp

    @app.task(name="j.big", bind=True, shared=False, compass_model="small", compass_exec_ms=5)
    def big(self: Any, inp: Any, kb: int) -> str:
        ran(self)
        return "x" * (kb * 1024)

    @app.task(name="j.flaky", bind=True, shared=False, compass_model="small",
              compass_exec_ms=5, max_retries=5)
    def flaky(self: Any, x: Any) -> Any:
        saw(self)
        log.rpush("flaky", f"{self.request.hostname}|"
                           f"{(self.request.delivery_info or {}).get('routing_key')}")
        if self.request.retries < 2:
            # look very busy, so a re-placed retry goes to the other worker
            app.compass.store.charge(self.request.hostname, 100_000)
            raise self.retry(countdown=0)
        return x

    @app.task(name="j.embed", bind=True, shared=False, compass_model="small",
              compass_exec_ms=20,
              compass_batch={"max_size": 8, "max_wait_ms": 0, "per_item_ms": 2})
    def embed(self: Any, xs: list[Any]) -> list[Any]:
        """Batched: 200 ms for the first input, 10 ms for each other (a GPU's curve; the
        planner is told 20 ms and 2 ms); 'bad' fails alone, 'boom' fails the whole call."""
        log.rpush("batches", str(len(xs)))
        for _ in xs:
            log.executed(f"embed:{_}")
        if "boom" in xs:
            raise RuntimeError("boom in the batch")
        time.sleep(0.2 + 0.01 * (len(xs) - 1))
        return [ValueError(f"bad input {x!r}") if x == "bad" else f"e({x})" for x in xs]

    @app.task(name="j.embed_curve", bind=True, shared=False, compass_model="small",
              compass_batch={"max_size": 8, "max_wait_ms": 0})
    def embed_curve(self: Any, xs: list[Any]) -> list[Any]:
        """Batched, with no run time or curve declared: 100 ms for the first input and
        20 ms for each other, for the worker to learn."""
        log.rpush("batches", str(len(xs)))
        time.sleep(0.1 + 0.02 * (len(xs) - 1))
        return [f"e({x})" for x in xs]

    @app.task(name="j.embed_slow", bind=True, shared=False, compass_model="small",
              compass_exec_ms=20, compass_batch={"max_size": 8, "max_wait_ms": 0})
    def embed_slow(self: Any, xs: list[Any]) -> list[Any]:
        """Batched and slow (3 s a batch): a worker can be killed in the middle of one."""
        log.rpush("batches", str(len(xs)))
        for _ in xs:
            log.executed(f"embed:{_}")
        time.sleep(3.0)
        return [f"e({x})" for x in xs]

    return app


app = make_app()
