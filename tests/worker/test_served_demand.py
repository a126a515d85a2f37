"""A worker's served demand: tracked per finished task, published coarsely (an idle
worker's record stops changing), and the cluster's demand learnt back as the cache's
eviction order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compass_celery.cache import EmulatedBackend, ModelCache, ModelRegistry
from compass_celery.planner.demand import cluster_demand
from compass_celery.planner.evict import eviction_rank
from compass_celery.planner.types import ClusterView, ModelDemand, WorkerView
from compass_celery.state.records import encode_record
from compass_celery.worker.served import RankFollower, ServedDemand


def worker(name: str, served: dict[str, ModelDemand] | None = None, **kw: object) -> WorkerView:
    base: dict = {"gpu_total_mb": 1000.0, "gpu_free_mb": 1000.0}
    base.update(kw)
    return WorkerView(name=name, queue=f"q.{name}", served=served or {}, **base)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_served_demand_is_young_then_coarse_then_still_once_idle() -> None:
    clock = Clock()
    served = ServedDemand(speed=2.0, time_scale=0.5, clock=clock)  # workload s = 2 x real
    assert served.published() == {}
    for _ in range(40):  # a 100 ms task every 0.25 real s = 0.5 workload s, for 10 s
        served.ran("busy", 100.0)
        clock.t += 0.25
        served.published()
    rates = served.published()
    assert set(rates) == {"busy"}
    # 2 tasks per workload second of 200 speed-1.0 ms: ~400 ms/s (bias-corrected)
    assert rates["busy"].per_s == pytest.approx(2.0, rel=0.15)
    assert rates["busy"].ms_per_s == pytest.approx(400.0, rel=0.15)
    assert served.published() is rates  # not recomputed within DEMAND_PUBLISH_S
    view = worker("w", served=dict(rates))
    changes = 0
    last = encode_record(view)
    for _ in range(600):  # idle for 300 real s (600 workload s, 20 tau)
        clock.t += 0.5
        raw = encode_record(replace(view, served=served.published()))
        changes += raw != last
        last = raw
    assert served.published() == {}
    assert changes <= 600 * 0.5 / 5 + 1  # at most one change per DEMAND_PUBLISH_S
    assert last == encode_record(worker("w"))  # decayed: the record is as if never served


def test_a_tracker_younger_than_its_min_age_publishes_nothing() -> None:
    clock = Clock()
    served = ServedDemand(speed=1.0, clock=clock, publish_every_s=0.0)
    served.ran("busy", 100.0)
    clock.t = 9.0
    served.ran("busy", 100.0)
    assert served.published() == {}
    clock.t = 10.5
    assert set(served.published()) == {"busy"}


def test_the_cache_follows_the_planners_eviction_order() -> None:
    sizes = {"busy": 40.0, "spare": 40.0, "new": 40.0}
    cache = ModelCache(EmulatedBackend(100.0, load_mb_per_s=1000, time_scale=0.0), 100.0,
                       sizes=sizes, registry=ModelRegistry())
    for m in ("spare", "busy"):  # busy used last: LRU alone would evict spare
        cache.acquire(m)
        cache.release(m)
    cache.acquire("busy")
    cache.release("busy")
    cache.acquire("spare")
    cache.release("spare")  # now spare is the most recent: LRU would evict busy
    me = worker("me", resident=frozenset({"busy", "spare"}), gpu_total_mb=100.0,
                gpu_free_mb=20.0, served={"busy": ModelDemand(800.0, 2.0)})
    other = worker("other", resident=frozenset({"spare"}), gpu_total_mb=100.0,
                   gpu_free_mb=60.0)
    cluster = ClusterView.of((me, other), sizes, demand=cluster_demand((me, other)))
    clock = Clock()
    calls: list[int] = []

    def read() -> ClusterView:
        calls.append(1)
        return cluster

    follower = RankFollower(cache, read, every_s=2.0, clock=clock)
    assert follower.maybe_refresh() and not follower.maybe_refresh()  # at most every 2 s
    assert cache.decider.rank == eviction_rank(cluster) and len(calls) == 1
    cache.acquire("new")
    cache.release("new")
    assert set(cache.resident()) == {"busy", "new"}  # the spare copy went, not the busy one


def test_the_rank_follower_never_raises() -> None:
    cache = ModelCache(EmulatedBackend(100.0, time_scale=0.0), 100.0, sizes={"a": 1.0},
                       registry=ModelRegistry())

    def broken() -> ClusterView:
        raise RuntimeError("redis went away")

    follower = RankFollower(cache, broken, every_s=0.0)
    assert not follower.maybe_refresh() and cache.decider.rank == {}
    assert not RankFollower(cache, lambda: None, every_s=0.0).maybe_refresh()


def test_a_steady_load_does_not_change_what_is_published() -> None:
    clock = Clock()
    served = ServedDemand(speed=1.0, clock=clock, min_age_s=0.0, publish_every_s=1.0)
    for _ in range(600):  # 2 tasks a second for 300 s: settled
        served.ran("m", 100.0)
        clock.t += 0.5
    settled = served.published()
    for k in range(40):  # the same load, a little faster or slower: within tolerance
        served.ran("m", 110.0 if k % 2 else 90.0)
        clock.t += 0.5
        assert served.published() is settled
    for _ in range(60):  # the load doubles: a rate moves by more than 20%
        served.ran("m", 100.0)
        served.ran("m", 100.0)
        clock.t += 0.5
    assert served.published()["m"].per_s > 1.2 * settled["m"].per_s
