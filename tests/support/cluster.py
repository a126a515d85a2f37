"""Shared helpers for the fault tests: a cluster of real jobapp workers and its run log."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import redis

from compass_celery.emulated import make_app as emulated_app
from compass_celery.local import WorkerProcess, wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "big,small"]


def start(url: str, compass_workers: Any, names: list[str], *, timeout_s: float = 1.0,
          env: dict[str, str] | None = None, per_worker_env: dict[str, dict[str, str]] | None
          = None, extra_args: list[str] | None = None, **conf: Any
          ) -> tuple[Any, list[WorkerProcess]]:
    """Start real workers named ``names`` and a producer app; wait until all are live."""
    base = {"COMPASS_BROKER_URL": url, "COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": str(timeout_s),
            **(env or {})}
    ws = [compass_workers("tests.support.jobapp", n, *GPU, *(extra_args or []),
                          env={**base, **(per_worker_env or {}).get(n, {})}) for n in names]
    app = make_app(url, compass_snapshot_ttl_s=0.0, compass_heartbeat_timeout_s=timeout_s,
                   **conf)
    wait_live(app, len(names), ws)
    app.log = redis.Redis.from_url(url)
    return app, ws


def emulated(url: str, compass_workers: Any, models: dict[str, float] | None,
             names: list[str], *args: str) -> Any:
    """Real emulated-GPU workers named ``names`` (``args``: their worker options) knowing
    ``models`` (None: the emulated app's own), and a producer app reading fresh state;
    waits until all are live. The app's ``workers`` are the processes; the caller closes
    ``app.compass``."""
    env = {"COMPASS_BROKER_URL": url, "COMPASS_REDIS_URL": url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0"}
    conf: dict[str, Any] = {}
    if models is not None:
        env["COMPASS_MODELS"] = json.dumps(models)
        conf["compass_models"] = models
    ws = [compass_workers("compass_celery.emulated_app", n, *args, env=env) for n in names]
    app = emulated_app(url, state_url=url, compass_snapshot_ttl_s=0.0, **conf)
    wait_live(app, len(names), ws, 40)
    app.workers = ws
    return app


def wait_live(app: Any, n: int, ws: list[WorkerProcess], timeout: float = 30) -> None:
    try:
        wait_until(lambda: len(app.compass.reader.store.snapshot(
            time.time(), app.compass.settings["heartbeat_timeout_s"]).workers) == n,
            timeout, f"{n} live workers")
    except TimeoutError:
        raise AssertionError(worker_logs(ws)) from None


def executions(app: Any) -> Counter[str]:
    """Task id -> how many times it ran (the jobapp tasks count every execution)."""
    return Counter({k.decode(): int(v) for k, v in app.log.hgetall("execs").items()})


def compass_keys_left(app: Any, queues: list[str]) -> dict[str, int]:
    """Messages still sitting in the given queues (all priority lists) or their staging."""
    from compass_celery.broker.kombu_redis import RedisLayout

    client = app.log
    out = {}
    for q in queues:
        names = [*RedisLayout().lists(q), f"compass:staging:{q}"]
        n = sum(client.llen(k) for k in names)
        if n:
            out[q] = n
    return out


def wait_started(app: Any, *results: Any, timeout: float = 20.0) -> None:
    """Wait until each of ``results`` (jobapp tasks, which count a run as it starts) has
    started on its worker: what is sent next queues behind it."""
    client = app.compass.store.client
    wait_until(lambda: all(client.hexists("execs", r.id) for r in results), timeout,
               f"{len(results)} task(s) to start")
