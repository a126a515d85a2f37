"""The pure side imports for real with celery, kombu, redis and torch unimportable.

``tests/test_layout.py`` checks the same rule on the source; this runs the imports, in a
fresh interpreter whose ``sys.meta_path`` refuses those names, through the real
``compass_celery/__init__.py`` (its public names load lazily, so it must not need Celery).
"""

from __future__ import annotations

from tests.support.blocked import NOTHING_LEAKED, run_blocked

#: What the simulator, the planner and the cache decisions need, and nothing of the edges.
PURE = ("compass_celery.sim", "compass_celery.planner", "compass_celery.workload",
        "compass_celery.cache.decisions")


def test_the_pure_side_imports_with_celery_kombu_redis_and_torch_blocked() -> None:
    out = run_blocked(f"import {', '.join(PURE)}\n" + NOTHING_LEAKED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


def test_the_blocker_blocks() -> None:
    """The check is not vacuous: the Celery side fails to import under the same prelude."""
    out = run_blocked("import compass_celery.jobs\n")
    assert out.returncode != 0
    assert "is blocked: the pure side must not import it" in out.stderr
