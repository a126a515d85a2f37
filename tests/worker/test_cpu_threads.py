"""A worker on ``cpu`` runs torch on its share of the host's cores, not on all of them:
two CPU workers on one host each take half, ``--compass-torch-threads`` sets the number,
an exported ``OMP_NUM_THREADS`` is kept."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from compass_celery.local import wait_until
from compass_celery.settings import SettingsError, with_flags
from compass_celery.testing import worker_logs
from compass_celery.worker.threads import CpuThreads, cores, cpu_workers_on, share
from tests.support.own_model_app import make_app


def _worker(name: str, device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(name=name, device=device)


def test_the_share_is_the_cores_over_the_processes_sharing_them() -> None:
    assert share(16, 2, 1) == 8
    assert share(16, 2, 4) == 2  # prefork: each pool process runs torch
    assert share(2, 3, 1) == 1  # never 0
    peers = [_worker("a@box"), _worker("b@box"), _worker("gpu@box", "cuda:0"),
             _worker("c@other"), _worker("d@box", "emulated")]
    assert cpu_workers_on("box", "me@box", peers) == 3  # a, b and this one (unpublished)
    assert cpu_workers_on("box", "a@box", peers) == 2


def test_the_rule_follows_setting_then_environment_then_the_share() -> None:
    alone = CpuThreads("w@box", "cpu", None, environ={}, n_cores=8)
    assert alone.wanted == 8
    alone.observe([_worker("w@box"), _worker("v@box"), _worker("x@elsewhere")])
    assert alone.wanted == 4
    fixed = CpuThreads("w@box", "cpu", 3, environ={"OMP_NUM_THREADS": "6"}, n_cores=8)
    fixed.observe([_worker("v@box")])
    assert fixed.wanted == 3
    assert CpuThreads("w@box", "cpu", None, environ={"OMP_NUM_THREADS": "6"},
                      n_cores=8).wanted is None  # the user's own: left as it is
    assert CpuThreads("w@box", "cuda:0", None, environ={}, n_cores=8).wanted is None
    assert CpuThreads("w@box", "cpu", None, concurrency=4, environ={}, n_cores=8).wanted == 2


def test_a_bad_thread_count_is_refused_naming_the_flag() -> None:
    with pytest.raises(SettingsError, match="--compass-torch-threads"):
        with_flags(make_app("memory://").compass.settings, {"torch_threads": 0})


@pytest.mark.redis
def test_real_cpu_workers_take_their_share_of_the_cores(compass_redis_url, compass_workers):
    pytest.importorskip("torch")
    env = {"COMPASS_BROKER_URL": compass_redis_url}
    names = ["t0@box", "t1@box", "fixed@alone", "omp@own"]
    ws = [compass_workers("tests.support.own_model_app", n, "--compass-gpu", "cpu", *extra,
                          env={**env, **more})
          for n, extra, more in (
              (names[0], [], {}), (names[1], [], {}),
              (names[2], ["--compass-torch-threads", "3"], {}),
              (names[3], [], {"OMP_NUM_THREADS": "1"}))]
    app = make_app(compass_redis_url)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5).workers) == 4,
                   60, "four live workers")
        task = app.tasks["own.torch_threads"]

        def threads(name: str) -> int:
            return task.apply_async(queue=app.compass.queue_for(name)).get(timeout=20)

        half = max(1, cores() // 2)
        # each counts the other within a rank refresh (2 s) of its record appearing
        wait_until(lambda: threads(names[0]) == half and threads(names[1]) == half, 20,
                   f"both workers on box at {half} thread(s)")
        assert threads(names[2]) == 3
        assert threads(names[3]) == 1  # its own share would be all the cores
    except (AssertionError, TimeoutError) as exc:
        raise AssertionError(f"{exc}\n{worker_logs(ws)}") from None
