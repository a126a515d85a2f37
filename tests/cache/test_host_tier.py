"""One host-RAM tier for the emulated GPU and the simulator: same models kept, same order."""

from __future__ import annotations

import dataclasses

from compass_celery.cache.backends import EmulatedBackend
from compass_celery.cache.decisions import Evict
from compass_celery.cache.host_tier import HostTier
from compass_celery.sim.cluster import SimCluster
from compass_celery.sim.engine import Engine
from compass_celery.workload import WorkerSpec

SIZES = {"a": 400.0, "b": 300.0, "c": 500.0, "huge": 2000.0}


def test_least_recently_evicted_goes_first_and_oversize_is_not_kept() -> None:
    tier = HostTier(1000.0)
    for name in ("a", "b", "c"):
        tier.add(name, SIZES[name])
    assert list(tier) == ["b", "c"] and "a" not in tier  # 1200 > 1000: a dropped
    tier.add("b", 300.0)  # evicted again: the most recent now
    tier.add("a", 400.0)
    assert tier.sizes() == {"b": 300.0, "a": 400.0}  # c was the oldest
    tier.add("huge", SIZES["huge"])
    assert "huge" not in tier and len(tier) == 2
    tier.discard("a")
    tier.discard("never")
    assert list(tier) == ["b"]
    tier.clear()
    assert not tier and HostTier().capacity_mb == float("inf")


def test_emulated_backend_and_simulated_worker_keep_the_same_models() -> None:
    backend = EmulatedBackend(5000.0, time_scale=0.0, host_capacity_mb=1000.0)
    spec = dataclasses.replace(WorkerSpec("w", 5000.0), host_mem_mb=1000.0)
    cluster = SimCluster((spec,), Engine(), SIZES, shared=False,
                         on_done=lambda *a: None, on_failed=lambda *a: None)
    worker = cluster.workers[0]
    for name in ("a", "b", "c", "huge", "b", "a"):
        backend.load(name, None, SIZES[name])
        backend.evict(name)
        worker._apply([Evict(name)])  # the simulated worker carries out an eviction
    assert backend.host_resident() == worker.host.sizes() == {"b": 300.0, "a": 400.0}
    assert backend.host_capacity_mb == 1000.0
    assert backend.load_ms("a", 400.0) < backend.load_ms("c", 500.0) * 400 / 500
