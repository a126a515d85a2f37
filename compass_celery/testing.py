"""pytest plugin: a private Redis and real worker processes for Compass tests.

Fixture names start with ``compass_`` and never shadow Celery's ``celery_*``
fixtures (which pytest-celery's docker fixtures also claim). Layered like
celery.contrib.pytest: ``compass_redis_server`` (whole run) ->
``compass_redis_url`` (flushed per test) -> ``compass_workers`` (processes).

Without ``redis-server`` the Redis-backed tests skip locally and fail in CI
(``CI`` set in the environment), as dramatiq's ``check_redis`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .local import LocalRedisError, RedisServer, WorkerProcess


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


@pytest.fixture
def compass_redis_url(compass_redis_server: RedisServer) -> str:
    """The private Redis's URL, emptied before each test."""
    import redis

    if not compass_redis_server.ping():
        compass_redis_server.start()
    redis.Redis.from_url(compass_redis_server.url).flushall()
    return compass_redis_server.url


@pytest.fixture
def compass_workers() -> Iterator[Callable[..., WorkerProcess]]:
    """Factory starting real ``celery worker`` processes; all are stopped afterwards.

    ``start(app, name, *args, env={...})`` returns the running :class:`WorkerProcess`.
    On a failing test, each worker's log is printed to help the diagnosis.
    """
    started: list[WorkerProcess] = []

    def start(app: str, name: str, *args: str, env: dict[str, str] | None = None
              ) -> WorkerProcess:
        proc = WorkerProcess(app, name, args, env=env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def worker_logs(workers: list[WorkerProcess]) -> str:
    """All the given workers' logs, for assertion messages."""
    return "\n".join(f"--- {w.name} ---\n{w.log()[-4000:]}" for w in workers)


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "redis: needs a real redis-server")
