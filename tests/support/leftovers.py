"""A pytest plugin for this suite: the run leaves nothing in the temp dir and raises no
warning of its own.

The session gets a private temp dir (``TMPDIR`` and ``tempfile.tempdir``, so the worker
and Redis processes it starts use it too); pytest's own ``tmp_path`` folders stay where
they were, so a failing test's are kept for the diagnosis. At the end the run fails (exit
status 1) when anything is left in the private dir, or when a ``DuplicateTaskNameWarning``
was raised (an app bound a task name twice, usually a shared ``@app.task`` inherited by a
later app), naming each one. Other runs on the same machine cannot trip it. Loaded from
``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Warnings the suite must never raise itself, by class name.
FORBIDDEN = ("DuplicateTaskNameWarning",)
#: What libraries keep in the temp dir on their own (torch's compile cache, made when
#: sentence-transformers imports torch's inductor): not the suite's; removed all the same.
LIBRARY_CACHES = ("torchinductor_",)


class Leftovers:
    """This session's private temp dir, and the forbidden warnings raised on the way."""

    def __init__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in ("TMPDIR", "PYTEST_DEBUG_TEMPROOT")}
        real = tempfile.gettempdir()
        self.dir = Path(tempfile.mkdtemp(prefix="suite-tmp-", dir=real))
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", real)  # tmp_path stays where it was
        os.environ["TMPDIR"] = str(self.dir)
        tempfile.tempdir = str(self.dir)
        self.warnings: list[str] = []

    def finish(self) -> list[str]:
        """Each thing the run left or raised, as one line; the private dir is removed and
        the environment put back."""
        left = sorted(p.name for p in self.dir.iterdir()
                      if not p.name.startswith(LIBRARY_CACHES))
        shutil.rmtree(self.dir, ignore_errors=True)
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        return [f"left in the temp dir: {name}" for name in left] + self.warnings


_STATE: dict[str, Leftovers] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Give the run its private temp dir before any test starts."""
    _STATE["run"] = Leftovers()


def pytest_warning_recorded(warning_message: Any, when: str, nodeid: str,
                            location: Any) -> None:
    """Keep each forbidden warning with the test that raised it."""
    run = _STATE.get("run")
    kind = type(warning_message.message).__name__
    if run is not None and kind in FORBIDDEN:
        first = (str(warning_message.message).strip().splitlines() or [""])[0]
        run.warnings.append(f"{nodeid or when}: {kind}: {first}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run, saying why, when it left files or raised a forbidden warning."""
    run = _STATE.pop("run", None)
    problems = run.finish() if run is not None else []
    if not problems:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "the suite's own leftovers (tests/support/leftovers.py)")
        for line in problems:
            reporter.write_line(line)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
