"""The suite's own check (tests/support/leftovers.py): a run that leaves a file in the temp
dir, or raises a DuplicateTaskNameWarning, fails and says what; a clean run passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LEAVES_A_FILE = '''
import tempfile

def test_leaves_a_log():
    fd, _ = tempfile.mkstemp(prefix="compass-", suffix=".log")
'''

WARNS = '''
from celery import Celery

def one():
    return 1


def two():
    return 2


def test_binds_a_name_twice():
    app = Celery("twice", set_as_current=False)
    app.task(name="same.name", shared=False)(one)
    app.task(name="same.name", shared=False)(two)
    app.finalize()
'''

CLEAN = '''
import tempfile

def test_cleans_up():
    with tempfile.TemporaryDirectory(prefix="compass-") as d:
        assert d
'''


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_DEBUG_TEMPROOT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.support.leftovers", "-W", "default", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("body", "said"), [
    (LEAVES_A_FILE, "left in the temp dir: compass-"),
    (WARNS, "test_it.py::test_binds_a_name_twice: DuplicateTaskNameWarning: Task name 'same.name'"),
])
def test_a_run_that_leaves_something_fails_naming_it(tmp_path: Path, body: str,
                                                    said: str) -> None:
    run = _run(tmp_path, body)
    assert run.returncode == 1, run.stdout[-3000:]
    assert "1 passed" in run.stdout and said in run.stdout, run.stdout[-3000:]


def test_a_clean_run_passes(tmp_path: Path) -> None:
    run = _run(tmp_path, CLEAN)
    assert run.returncode == 0, run.stdout[-3000:]
