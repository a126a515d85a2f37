"""pytest plugin: a private Redis and real worker processes for Compass tests.

Fixture names start with ``compass_`` and never shadow Celery's ``celery_*``
fixtures (which pytest-celery's docker fixtures also claim). Layered like
celery.contrib.pytest: ``compass_redis_server`` (whole run) ->
``compass_redis_url`` (flushed per test) -> ``compass_workers`` (processes) ->
``compass_cluster`` (N live emulated-GPU workers of your app). ``compass_app`` is an
eager app with in-process worker state: no broker, no Redis.

Opt in from your ``conftest.py``: ``pytest_plugins = ["compass_celery.testing"]``.

Without ``redis-server`` the Redis-backed tests skip locally and fail in CI
(``CI`` set in the environment), as dramatiq's ``check_redis`` does.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from .local import LocalRedisError, RedisServer, WorkerProcess
from .planner.types import WorkerView


def add_worker(app: Any, name: str, *, gpu_mb: float = 16000.0, resident: Iterable[str] = (),
               backlog_ms: float = 0.0, speed: float = 1.0, free_mb: float | None = None,
               load_mb_per_s: float | None = None) -> WorkerView:
    """Declare a worker in an eager app's in-process state, for tests and what-if planning:
    ``add_worker(app, "gpu0", gpu_mb=16000, resident=["captioner"])``."""
    c = app.compass
    c.follow_mode()
    sizes = c.model_sizes()
    resident = frozenset(resident)
    used = sum(sizes.get(m, 0.0) for m in resident)
    view = WorkerView(
        name=name, queue=c.queue_for(name), gpu_total_mb=gpu_mb,
        gpu_free_mb=max(0.0, gpu_mb - used) if free_mb is None else free_mb,
        resident=resident, speed=speed, heartbeat=time.time(),
        load_mb_per_s=load_mb_per_s or c.settings.load_mb_per_s,
        host_load_mb_per_s=c.settings.host_load_mb_per_s,
        net_mb_per_s=c.settings.net_mb_per_s, device="emulated")
    c.store.publish(view)
    c.store.set_backlog(name, backlog_ms)
    c.reader.invalidate()
    return view


@pytest.fixture(scope="session")
def compass_redis_server() -> Iterator[RedisServer]:
    """A real ``redis-server`` on a free port for the whole test run."""
    try:
        server = RedisServer().start()
    except LocalRedisError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs redis-server: {exc}")
        pytest.skip(str(exc))
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def compass_redis_url(compass_redis_server: RedisServer) -> str:
    """The private Redis's URL, emptied before each test."""
    import redis

    if not compass_redis_server.ping():
        compass_redis_server.start()
    redis.Redis.from_url(compass_redis_server.url).flushall()
    return compass_redis_server.url


@pytest.fixture
def compass_workers(tmp_path: Any) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory starting real ``celery worker`` processes; all are stopped afterwards.

    ``start(app, name, *args, env={...})`` returns the running :class:`WorkerProcess`.
    Each worker logs to the test's ``tmp_path`` (pytest keeps it by its
    ``tmp_path_retention_policy``; ``worker_logs`` puts the logs in assertion messages).
    """
    started: list[WorkerProcess] = []

    def start(app: str, name: str, *args: str, env: dict[str, str] | None = None
              ) -> WorkerProcess:
        log = tmp_path / f"compass-{name.replace('@', '_')}.log"
        proc = WorkerProcess(app, name, args, env=env, log_path=str(log)).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def compass_config() -> dict[str, Any]:
    """Settings for ``compass_app`` (``compass_models`` and the like); override it."""
    return {}


@pytest.fixture
def compass_app(compass_config: dict[str, Any]) -> Iterator[Any]:
    """A fresh eager Celery app with Compass: tasks run inline, placement runs against
    in-process workers you declare with :func:`add_worker`."""
    from celery import Celery

    from .app import Compass

    app = Celery("compass-test", set_as_current=False, broker="memory://")
    app.conf.update(task_always_eager=True, task_eager_propagates=True, compass_validate=True,
                    **compass_config)
    Compass(app)
    yield app


@dataclass
class Cluster:
    """Live workers started by ``compass_cluster``."""

    app: Any
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """The workers' node names (``name@host``)."""
        return [w.name for w in self.workers]

    def logs(self) -> str:
        """All the workers' logs, for assertion messages."""
        return worker_logs(self.workers)


@pytest.fixture
def compass_cluster(compass_workers: Callable[..., WorkerProcess],
                    request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """Factory: ``compass_cluster(app, "proj.celery", n=2, gpu_mb=4000, env={...})`` starts
    ``n`` real emulated-GPU workers of the app module, waits until ``app`` sees them all
    live in its state Redis, and returns a :class:`Cluster`. Their logs are printed when
    the test fails. ``env`` carries what the module needs to find the broker."""
    clusters: list[Cluster] = []

    def start(app: Any, module: str, n: int = 2, *, gpu_mb: float = 4000.0,
              preload: str = "", env: dict[str, str] | None = None,
              timeout_s: float = 30.0) -> Cluster:
        app.compass.follow_mode()  # an eager test may have run before: wait on Redis
        args = ["--compass-emulate-gpu-mb", str(gpu_mb)]
        if preload:
            args += ["--compass-preload", preload]
        tag = request.node.name[-24:].replace("[", "-").replace("]", "")
        cluster = Cluster(app, [compass_workers(module, f"w{i}@{tag}", *args, env=env)
                                for i in range(n)])
        clusters.append(cluster)
        timeout = app.compass.settings.heartbeat_timeout_s
        deadline = time.monotonic() + timeout_s
        while len({w.name for w in app.compass.store.snapshot(time.time(), timeout).workers}
                   & set(cluster.names)) < n:
            if time.monotonic() > deadline or not all(w.alive() for w in cluster.workers):
                pytest.fail(f"compass_cluster: {n} workers of {module} not live after "
                            f"{timeout_s:.0f}s\n{cluster.logs()}")
            time.sleep(0.05)
        app.compass.reader.invalidate()
        return cluster

    yield start
    report = getattr(request.node, "compass_report", None)
    if report is not None and report.failed:
        for cluster in clusters:
            print(f"\ncompass_cluster worker logs:\n{cluster.logs()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
    """Keep the test's own outcome on the item, for ``compass_cluster``'s teardown."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.compass_report = report


def worker_logs(workers: list[WorkerProcess]) -> str:
    """All the given workers' logs, for assertion messages."""
    return "\n".join(f"--- {w.name} ---\n{w.log()[-4000:]}" for w in workers)


def pytest_configure(config: Any) -> None:
    """Register the ``redis`` marker of tests that need a real redis-server."""
    config.addinivalue_line("markers", "redis: needs a real redis-server")
