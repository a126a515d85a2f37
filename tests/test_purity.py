"""The pure side imports for real with celery, kombu, redis and torch unimportable.

``tests/test_layout.py`` checks the same rule on the source; this runs the imports, in a
fresh interpreter whose ``sys.meta_path`` refuses those names, through the real
``compass_celery/__init__.py`` (its public names load lazily, so it must not need Celery).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("celery", "kombu", "redis", "torch")
#: What the simulator, the planner and the cache decisions need, and nothing of the edges.
PURE = ("compass_celery.sim", "compass_celery.planner", "compass_celery.workload",
        "compass_celery.cache.decisions")

PRELUDE = textwrap.dedent(
    """
    import sys

    BLOCKED = set(sys.argv[1].split(","))

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked: the pure side must not import it")
            return None

    sys.meta_path.insert(0, Blocker())
    for _name in list(sys.modules):
        if _name.split(".")[0] in BLOCKED:
            del sys.modules[_name]
    """
)


def _run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after the prelude, in a fresh interpreter, from the repository root."""
    return subprocess.run([sys.executable, "-c", PRELUDE + code, ",".join(BLOCKED)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_pure_side_imports_with_celery_kombu_redis_and_torch_blocked() -> None:
    code = (f"import {', '.join(PURE)}\n"
            "leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)\n"
            "assert not leaked, leaked\n"
            "print('pure')\n")
    out = _run_blocked(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


def test_the_blocker_blocks() -> None:
    """The check is not vacuous: the Celery side fails to import under the same prelude."""
    out = _run_blocked("import compass_celery.jobs\n")
    assert out.returncode != 0
    assert "is blocked: the pure side must not import it" in out.stderr
