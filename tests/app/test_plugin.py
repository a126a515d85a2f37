"""The pytest plugin: opt-in, an eager ``compass_app``, and a live ``compass_cluster``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compass_celery.testing import add_worker


@pytest.fixture
def compass_config():
    return {"compass_models": {"captioner": 950.0}}


def test_compass_app_runs_eagerly_and_places_on_in_process_workers(compass_app):
    @compass_app.task(compass_model="captioner", compass_exec_ms=120)
    def caption(url: str) -> str:
        return f"a caption of {url}"

    add_worker(compass_app, "gpu0", gpu_mb=16000)
    add_worker(compass_app, "gpu1", gpu_mb=16000, resident=["captioner"])
    res = caption.delay("x.jpg")
    assert res.get() == "a caption of x.jpg"
    assert compass_app.compass.placement(res.id).worker == "gpu1"  # the model is resident
    assert compass_app.compass.store.client is None  # no Redis at all


@pytest.mark.parametrize("opt_in", [False, True])
def test_the_plugin_is_opt_in(tmp_path, opt_in):
    if opt_in:
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["compass_celery.testing"]\n')
    out = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "-q", "-p",
                          "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert ("compass_cluster" in out.stdout) is opt_in, out.stdout[-2000:]
