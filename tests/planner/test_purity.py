"""The planner imports with celery, kombu, redis and torch blocked: it is pure."""

from __future__ import annotations

from tests.support.blocked import NOTHING_LEAKED, run_blocked

PLANS = """
import compass_celery.planner as planner
from compass_celery.planner import ClusterView, DagSpec, TaskSpec, WorkerView
c = ClusterView.of([WorkerView("w", "q", 16000.0, 16000.0)], {"m": 100.0})
for name in planner.POLICIES:
    planner.get_policy(name).plan(DagSpec.single(TaskSpec("t", "m")), c)
import compass_celery.planner.adjust, compass_celery.planner.evaluate  # noqa: E401
"""


def test_planner_imports_with_celery_kombu_redis_and_torch_blocked() -> None:
    out = run_blocked(PLANS + NOTHING_LEAKED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"


def test_plan_timing_bench_runs() -> None:
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    run = CliRunner().invoke(compass_command, ["bench", "plan-timing", "--workers", "4,64",
                                               "--reps", "5"])
    assert run.exit_code == 0, run.output
    lines = run.output.splitlines()
    assert len(lines) == 9 and lines[0].split()[:3] == ["workers", "case", "snapshot"]
