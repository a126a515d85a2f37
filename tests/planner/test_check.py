"""compass_validate's plan checks catch broken plans and pass real ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compass_celery.planner import get_policy
from compass_celery.planner.check import check_plan
from compass_celery.planner.types import (
    ClusterView,
    DagSpec,
    Plan,
    PlanningError,
    TaskSpec,
    WorkerView,
)

DAG = DagSpec(nodes={"a": TaskSpec("a", "m", 10, 5), "b": TaskSpec("b", "m", 20)},
              edges=(("a", "b"),), name="ab")
CLUSTER = ClusterView.of([WorkerView("w1", "q1", 1000, 1000), WorkerView("w2", "q2", 100, 100)],
                         {"m": 500})


@pytest.mark.parametrize("policy", ["compass", "heft", "jsq", "round-robin", "random", "hash",
                                    "celery-default"])
def test_real_plans_pass(policy):
    check_plan(get_policy(policy).plan(DAG, CLUSTER), DAG, CLUSTER)


def test_broken_plans_are_named():
    good = get_policy("compass").plan(DAG, CLUSTER)
    p = dict(good.placements)
    early = replace(p["b"], start_ms=p["a"].finish_ms - 5)
    with pytest.raises(PlanningError, match="'b' starts at .* before its predecessor 'a'"):
        check_plan(Plan("x", {**p, "b": early}), DAG, CLUSTER)
    small = replace(p["a"], worker="w2", queue="q2")
    with pytest.raises(PlanningError, match="model 'm', 500 MB\\) on w2 with 100 MB"):
        check_plan(Plan("x", {**p, "a": small}), DAG, CLUSTER)
    with pytest.raises(PlanningError, match="unplaced: \\['b'\\]"):
        check_plan(Plan("x", {"a": p["a"]}), DAG, CLUSTER)
    with pytest.raises(PlanningError, match="dead worker 'ghost'"):
        check_plan(Plan("x", {**p, "a": replace(p["a"], worker="ghost")}), DAG, CLUSTER)
