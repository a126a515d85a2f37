"""Run code in a fresh interpreter where celery, kombu, redis and torch cannot be imported:
how the tests prove the pure side (planner, simulator, worker core, cache decisions) is
pure, through the real ``compass_celery/__init__.py`` (its public names load lazily)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("celery", "kombu", "redis", "torch")

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

#: Put after the code under test: fails if a blocked module got loaded anyway.
NOTHING_LEAKED = ("leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)\n"
                  "assert not leaked, leaked\n"
                  "print('pure')\n")


def run_blocked(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after the prelude, in a fresh interpreter, from the repository root."""
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code),
                           ",".join(BLOCKED)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
