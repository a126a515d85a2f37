"""A worker's ``--compass-*`` flags are checked as the settings they override are: a bad
one stops the worker at start with a message naming the flag, its value and what is
allowed (a worker once started with ``--compass-speed 0`` and published a record every
reader dropped, so it was silently never chosen)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compass_celery.settings import SettingsError, resolve, with_flags


@pytest.mark.parametrize("flags, message", [
    ({"speed": 0.0}, r"--compass-speed must be > 0, got 0.0"),
    ({"emulate_gpu_mb": -5.0}, r"--compass-emulate-gpu-mb must be >= 1 MB, got -5.0"),
    ({"load_mb_per_s": float("inf")}, r"--compass-load-mb-per-s must be finite"),
    ({"metrics_port": 0}, r"--compass-metrics-port must be >= 1, got 0"),
])
def test_a_bad_flag_is_refused_naming_it(flags, message):
    with pytest.raises(SettingsError, match=message):
        with_flags(resolve({}), flags)


def test_good_flags_override_the_settings():
    values = with_flags(resolve({"compass_speed": 1.5}), {"speed": 2.0, "preload": "a,b"})
    assert values["speed"] == 2.0 and values["preload"] == ["a", "b"]


def test_the_same_bad_value_in_app_conf_names_the_setting():
    with pytest.raises(SettingsError, match=r"compass_speed must be > 0, got 0"):
        resolve({"compass_speed": 0})
    with pytest.raises(SettingsError, match=r"compass_emulate_gpu_mb must be >= 1 MB"):
        resolve({"compass_emulate_gpu_mb": -1})


@pytest.mark.parametrize("flag, value, message", [
    ("--compass-speed", "0", "--compass-speed must be > 0, got 0.0"),
    ("--compass-emulate-gpu-mb", "-100", "--compass-emulate-gpu-mb must be >= 1 MB"),
])
def test_a_worker_started_with_a_bad_flag_exits_naming_it(flag, value, message):
    # no broker is reached: the flags are checked while the worker is built
    env = {**os.environ, "COMPASS_BROKER_URL": "redis://127.0.0.1:1/0"}
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.support.jobapp",
                           "worker", "-n", "bad@flags", "--pool", "solo", flag, value],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
