"""Your own model, as the README shows it: a loader registered with ``compass_celery.model``
runs on a real torch worker and in eager mode, and a model declared only by size
(``compass_models``, your code loads it) is placed without compass trying to load it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from compass_celery.cache import UnknownModelError, set_current_cache  # noqa: E402
from compass_celery.local import wait_until  # noqa: E402
from compass_celery.needs import profile_key  # noqa: E402
from compass_celery.testing import add_worker, worker_logs  # noqa: E402
from tests.support.own_model_app import load_tiny_linear, make_app  # noqa: E402

VALUES = [0.5, -1.0, 2.0, 0.25]


def expected() -> list[float]:
    with torch.no_grad():
        return [round(v, 6) for v in load_tiny_linear()(torch.tensor(VALUES)).tolist()]


@pytest.mark.redis
def test_a_cpu_worker_runs_a_registered_loader_and_places_a_size_only_model(
        compass_redis_url, compass_workers):
    w = compass_workers("tests.support.own_model_app", "own@cpu", "--compass-gpu", "cpu",
                        env={"COMPASS_BROKER_URL": compass_redis_url})
    app = make_app(compass_redis_url)
    wait_until(lambda: app.compass.store.snapshot(time.time(), 5).workers,
               25, "the worker's record")
    try:
        assert app.tasks["own.embed"].delay(VALUES).get(timeout=20) == expected()
        assert app.tasks["own.mine"].delay(21).get(timeout=20) == 42
    except Exception:
        raise AssertionError(worker_logs([w])) from None
    log = Path(w.log_path).read_text()
    assert "loaded-by-my-code" in log and "no loader" in log  # said once, at start
    # compass does not load it, but learns its run time under its name, as for any model
    learned = profile_key("own.mine", "loaded-by-my-code")
    wait_until(lambda: learned in app.compass.store.snapshot(time.time(), 5).profiles, 10,
               "the size-only model's learned run time")


def test_eager_runs_the_real_body_with_the_registered_model() -> None:
    set_current_cache(None)
    app = make_app("memory://")
    app.conf.task_always_eager = True
    add_worker(app, "gpu0", gpu_mb=16000, resident=["tiny-linear"])
    res = app.tasks["own.embed"].delay(VALUES)
    assert res.get() == expected()
    assert app.compass.placement(res.id).worker == "gpu0"
    assert app.tasks["own.mine"].delay(4).get() == 8


def test_get_model_on_a_size_only_model_says_how_to_register_a_loader() -> None:
    set_current_cache(None)
    app = make_app("memory://")
    app.conf.task_always_eager = True
    add_worker(app, "gpu0", gpu_mb=16000)
    res = app.tasks["own.asks_for_mine"].apply()
    assert res.failed()
    assert isinstance(res.result, UnknownModelError)
    message = str(res.result)
    assert "'loaded-by-my-code'" in message and "compass_celery.model" in message
