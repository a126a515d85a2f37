"""The capacity signal: workers needed for the demand, the model mix and the deadline."""

from __future__ import annotations

import pytest

from compass_celery.planner.capacity import (
    DEFAULT_MAX_UTIL,
    MIN_UTIL,
    target_utilisation,
    tightest_deadline_ms,
    workers_needed,
)
from compass_celery.planner.types import ClusterView, ModelDemand, WorkerView
from tests.support.blocked import NOTHING_LEAKED, run_blocked


def worker(name: str, *resident: str, served: dict[str, ModelDemand] | None = None,
           **kw: float) -> WorkerView:
    return WorkerView(name, f"q.{name}", kw.pop("gpu_total_mb", 16000.0), 16000.0,
                      resident=frozenset(resident), served=served or {}, **kw)


def view(*workers: WorkerView, sizes: dict[str, float] | None = None,
         demand: dict[str, ModelDemand] | None = None,
         load_ms: dict[str, float] | None = None) -> ClusterView:
    return ClusterView.of(workers, sizes or {}, demand=demand, load_ms=load_ms)


def test_the_utilisation_keeps_the_mean_wait_within_the_deadline() -> None:
    # M/M/1: rho / (1 - rho) * S <= D - S  <=>  rho <= 1 - S / D
    rho = target_utilisation(100.0, 400.0)
    assert rho == pytest.approx(0.75)
    assert rho / (1 - rho) * 100.0 == pytest.approx(400.0 - 100.0)
    assert target_utilisation(10.0, 400.0) == DEFAULT_MAX_UTIL  # capped: bursts need room
    assert target_utilisation(390.0, 400.0) == MIN_UTIL  # floored
    assert target_utilisation(100.0, None) == DEFAULT_MAX_UTIL  # no deadline


def test_work_over_the_target_utilisation() -> None:
    # 3 workers' worth of 100 ms tasks, a 400 ms deadline: 3 / 0.75 = 4
    busy = {"m": ModelDemand(3000.0, 30.0)}
    ws = [worker(f"g{i}", "m") for i in range(4)]
    need = workers_needed(view(*ws, demand=busy), 400.0)
    assert (need.workers, need.target_util) == (4, pytest.approx(0.75))
    assert need.work_ms_per_s == 3000.0 and need.load_ms_per_s == 0.0
    # the same work with no deadline: 3 / 0.85 -> 4; a tighter one asks for more
    assert workers_needed(view(*ws, demand=busy), None).workers == 4
    assert workers_needed(view(*ws, demand=busy), 200.0).workers == 6  # 3 / 0.5
    # faster workers need fewer of them
    fast = [worker(f"g{i}", "m", speed=2.0) for i in range(4)]
    assert workers_needed(view(*fast, demand=busy), 400.0).workers == 2  # 1.5 / 0.85


def test_missing_replicas_add_their_load_and_the_mix_sets_a_floor() -> None:
    # "m" needs ceil(1600 / 800) = 2 replicas, only one worker holds it: one load of
    # 3000 ms (learned) over the 30 s horizon adds 100 ms of work per second.
    demand = {"m": ModelDemand(1600.0, 16.0)}
    need = workers_needed(view(worker("a", "m"), worker("b"), demand=demand,
                               load_ms={"m": 3000.0}, sizes={"m": 1000.0}), 400.0)
    assert need.load_ms_per_s == pytest.approx(100.0)
    assert need.by_replicas == 2
    assert need.workers == 3  # (1600 + 100) / (1000 * 0.75) = 2.27
    # without a learned time: size over the workers' load bandwidth (3000 MB at 1500 MB/s)
    unlearned = workers_needed(view(worker("a", "m"), worker("b"), demand=demand,
                                    sizes={"m": 3000.0}), 400.0)
    assert unlearned.load_ms_per_s == pytest.approx(2000.0 / 30)
    # many light models that do not fit on one GPU together: memory sets the floor
    light = {f"m{i}": ModelDemand(10.0, 1.0) for i in range(5)}
    sizes = {f"m{i}": 7000.0 for i in range(5)}
    mix = workers_needed(view(worker("a"), demand=light, sizes=sizes), 400.0)
    assert mix.by_memory == 3 and mix.workers == 3  # 35 GB over 16 GB GPUs


def test_the_demand_defaults_to_what_the_workers_served() -> None:
    served = {"m": ModelDemand(500.0, 5.0)}
    need = workers_needed(view(worker("a", "m", served=served), worker("b", "m", served=served)),
                          400.0)
    assert need.work_ms_per_s == 1000.0 and need.workers == 2  # 1 / 0.75
    assert workers_needed(view(worker("a")), 400.0).workers == 0  # nothing asked: none
    assert workers_needed(view(), 400.0).workers == 0
    # demand but no live worker (all scaled away): speed 1, and at least one
    assert workers_needed(view(demand={"m": ModelDemand(100.0, 1.0)}), 400.0).workers == 1


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_util"):
        workers_needed(view(), 400.0, max_util=0.0)
    with pytest.raises(ValueError, match="horizon_s"):
        workers_needed(view(), 400.0, horizon_s=0.0)


def test_the_tightest_deadline_of_the_classes() -> None:
    assert tightest_deadline_ms() == 400.0  # the default interactive class
    assert tightest_deadline_ms({"chat": {"deadline_ms": 150}}) == 150.0
    assert tightest_deadline_ms({"interactive": {"deadline_ms": None}}) is None


def test_the_capacity_module_is_pure() -> None:
    out = run_blocked("import compass_celery.planner.capacity\n" + NOTHING_LEAKED)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pure"
