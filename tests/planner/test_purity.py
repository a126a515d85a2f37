"""The planner imports with celery, kombu, redis and torch blocked: it is pure."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import compass_celery.planner

PACKAGE_DIR = str(Path(compass_celery.planner.__file__).parent.parent)

BLOCKER = textwrap.dedent(
    """
    import sys

    class Blocker:
        BLOCKED = {"celery", "kombu", "redis", "torch"}

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.BLOCKED:
                raise ImportError(f"planner must not import {name}")
            return None

    sys.meta_path.insert(0, Blocker())
    for mod in list(sys.modules):
        if mod.split(".")[0] in Blocker.BLOCKED:
            del sys.modules[mod]
    # compass_celery/__init__.py exposes Compass (celery-based) on purpose; stand in a
    # bare parent package so that only planner/'s own imports are under test.
    import pathlib, types  # noqa: E401
    root = pathlib.Path(PACKAGE_DIR)
    parent = types.ModuleType("compass_celery")
    parent.__path__ = [str(root)]
    sys.modules["compass_celery"] = parent
    import compass_celery.planner as planner
    from compass_celery.planner import ClusterView, DagSpec, TaskSpec, WorkerView
    c = ClusterView.of([WorkerView("w", "q", 16000.0, 16000.0)], {"m": 100.0})
    for name in planner.POLICIES:
        planner.get_policy(name).plan(DagSpec.single(TaskSpec("t", "m")), c)
    import compass_celery.planner.adjust, compass_celery.planner.evaluate  # noqa: E401
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in Blocker.BLOCKED)
    assert not leaked, leaked
    print("pure")
    """
)


def test_planner_imports_with_celery_kombu_redis_and_torch_blocked() -> None:
    out = subprocess.run(
        [sys.executable, "-c", f"PACKAGE_DIR = {PACKAGE_DIR!r}\n" + BLOCKER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


def test_plan_timing_bench_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    from compass_celery.bench.plan_timing import main

    assert main(["--workers", "4,64", "--reps", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and lines[0].split()[:3] == ["workers", "case", "snapshot"]
