"""ModelCache on the emulated backend: hits, evictions, on_change, OOM, prefetch overlap."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from compass_celery.cache import (
    CacheFullError,
    EmulatedBackend,
    EmulatedModel,
    ModelCache,
    ModelRegistry,
    ModelTooLargeError,
    UnknownModelError,
)

SIZES = {"a": 40.0, "b": 30.0, "c": 30.0, "d": 50.0}


def make(capacity: float = 100, backend_mb: float | None = None, scale: float = 0.0, **kw):
    backend = EmulatedBackend(backend_mb or capacity, load_mb_per_s=1000, time_scale=scale)
    return ModelCache(backend, capacity, sizes=SIZES, registry=ModelRegistry(), **kw)


def use(cache: ModelCache, model: str, queued: tuple[str, ...] = ()) -> object:
    m = cache.acquire(model, queued)
    cache.release(model)
    return m


def test_hits_misses_and_evictions() -> None:
    cache = make()
    assert use(cache, "a") == EmulatedModel("a", 40.0)
    use(cache, "a")
    use(cache, "b")
    use(cache, "c")
    assert (cache.hits, cache.misses, cache.loads, cache.evictions) == (1, 3, 3, 0)
    use(cache, "d", queued=("a",))  # b and c are not needed by queued tasks: they go
    assert set(cache.resident()) == {"a", "d"}
    assert cache.evictions == 2 and cache.hit_rate == 0.2
    assert set(cache.host_resident()) == {"b", "c"}  # the host-RAM tier keeps them


def test_running_model_survives_while_another_goes() -> None:
    cache = make()
    held = cache.acquire("a")  # a task is running on a
    use(cache, "b")
    use(cache, "c")
    use(cache, "d")
    assert "a" in cache.resident() and held is cache.backend.get("a")
    cache.release("a")


def test_on_change_keeps_published_state_in_step() -> None:
    seen: list[tuple[dict[str, float], float, float]] = []
    flights: list[set[str]] = []
    events: list[str] = []
    cache = make(on_event=lambda kind, f: events.append(f"{kind}:{f['model']}"))

    def changed() -> None:
        seen.append((cache.resident(), cache.free_mb, sum(cache.loading().values())))
        flights.append(set(cache.in_flight()))

    cache.on_change = changed
    for m in ("a", "b", "c", "d"):
        use(cache, m)
    assert events == [
        "model_loaded:a", "model_loaded:b", "model_loaded:c",
        "model_evicted:a", "model_evicted:b", "model_loaded:d",
    ]  # fmt: skip
    assert len(seen) == 10  # each load's start and end, each eviction
    assert flights[0] == {"a"} and seen[0][0] == {}  # a load under way is published
    assert flights[1] == set() and seen[1][0] == {"a": 40.0}  # and gone once it is done
    for resident, free, reserved in seen:  # free never counts memory a load has reserved
        assert free == pytest.approx(100 - sum(resident.values()) - reserved)
    assert seen[-1][0] == cache.resident() == {"c": 30.0, "d": 50.0}
    assert cache.free_mb == pytest.approx(100 - sum(cache.resident().values()))
    assert cache.backend.free_mb() == pytest.approx(cache.free_mb)


def test_never_fits_and_unknown_name_the_model() -> None:
    cache = make()
    cache._sizes["huge"] = 500
    with pytest.raises(ModelTooLargeError, match=r"'huge' \(500\.0 MB\)"):
        cache.acquire("huge")
    with pytest.raises(UnknownModelError, match="'nope'"):
        cache.acquire("nope")


def test_oom_evicts_and_retries_once_then_cache_full() -> None:
    # the cache believes in 100 MB, the (emulated) device really has 80
    events: list[str] = []
    cache = make(capacity=100, backend_mb=80, on_event=lambda k, f: events.append(k))
    use(cache, "a")  # 40 of 80 real
    use(cache, "d")  # 50 > 40 real free: OOM, evict a, retry: fits
    assert set(cache.resident()) == {"d"} and cache.evictions == 1
    held = cache.acquire("d")
    with pytest.raises(CacheFullError, match=r"'a' \(40\.0 MB\).*MB free"):
        cache.acquire("a")  # d is running; 50 + 40 > 80 real: fails even after the retry
    assert held and "a" not in cache.resident() and not cache.decider.loading
    cache.release("d")


def test_prefetch_overlaps_load_with_run() -> None:
    """Two queued tasks on different models finish sooner by about one load with prefetch."""
    scale, run_ms, load_ms = 0.2, 200.0, 250.0  # load: 250 MB at 1000 MB/s
    sizes = {"x": 250.0, "y": 250.0}

    def two_tasks(prefetch: bool) -> float:
        backend = EmulatedBackend(1000, load_mb_per_s=1000, time_scale=scale)
        cache = ModelCache(backend, sizes=sizes, registry=ModelRegistry())
        t0 = time.monotonic()
        cache.acquire("x", ["y"])
        if prefetch:
            cache.prefetch(["y"])
        cache.run(run_ms)
        cache.release("x")
        cache.acquire("y")
        cache.run(run_ms)
        cache.release("y")
        return (time.monotonic() - t0) / scale * 1000  # workload ms

    without, with_ = two_tasks(False), two_tasks(True)
    assert without == pytest.approx(2 * load_ms + 2 * run_ms, rel=0.15)
    assert without - with_ == pytest.approx(min(load_ms, run_ms), rel=0.25)


def test_prefetch_never_evicts_running_model_and_waits_are_hits() -> None:
    cache = make(scale=0.01)
    cache.acquire("a")
    use(cache, "b")
    assert cache.prefetch(["c", "d"]) == ["c"]  # d (50) would need a or b: both protected
    cache.wait_prefetch()
    assert set(cache.resident()) == {"a", "b", "c"}
    use(cache, "c")
    assert cache.hits == 1
    cache.release("a")


def test_concurrent_acquires_stay_within_capacity() -> None:
    cache = make(scale=0.001)
    errors: list[BaseException] = []

    def worker(seq: str) -> None:
        try:
            for m in seq:
                use(cache, m)
                assert sum(cache.resident().values()) <= 100
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in ("abcd" * 5, "dcba" * 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors or all(isinstance(e, CacheFullError) for e in errors)
    assert cache.hits + cache.misses >= 20


def test_preload_and_clear() -> None:
    changes: list[int] = []
    cache = make(on_change=lambda: changes.append(1))
    cache.preload(["a", "b"])
    assert set(cache.resident()) == {"a", "b"} and cache.hits == cache.misses == 0
    cache.clear()
    assert cache.resident() == {} and cache.host_resident() == {} and cache.free_mb == 100
    assert cache.loads == 0 and changes


def test_prefetch_spares_current_model_after_early_release() -> None:
    """get_model releases at once; the task's model must still survive a prefetch."""
    cache = make(scale=0.0)
    cache.decider.sizes["e"] = cache._sizes["e"] = 80.0
    for m in ("a", "b", "c"):
        use(cache, m)  # c is the running task's model, already released
    assert cache.prefetch(["e"]) == []  # a + b free only 70 MB: c would have to go
    assert set(cache.resident()) == {"a", "b", "c"} and cache.evictions == 0


def test_using_context_manager() -> None:
    cache = make()
    with cache.using("a") as m:
        assert m == EmulatedModel("a", 40.0) and cache._running() == {"a"}
    assert cache._running() == set()


def test_every_load_is_counted_and_traced_by_its_cause(caplog) -> None:
    """A task that finds its model missing, a background prefetch (named by its caller or
    not) and a preload each count under their cause, with a DEBUG line per load; a
    hit or a wait on a prefetch under way loads nothing more."""
    events: list[str] = []
    cache = make(on_event=lambda kind, f: events.append(f"{kind}:{f.get('cause')}"))
    with caplog.at_level(logging.DEBUG, logger="compass_celery.cache.manager"):
        cache.preload(["a"])
        use(cache, "b")
        use(cache, "b")
        cache.prefetch(["c"])
        cache.wait_prefetch()
        use(cache, "c")
        cache.prefetch(["d"], cause="arrival")  # d needs room: a (LRU) goes
        cache.wait_prefetch()
    assert cache.loads_by_cause == {"preload": 1, "task": 1, "prefetch": 1, "arrival": 1}
    assert sum(cache.loads_by_cause.values()) == cache.loads == 4
    assert [e for e in events if e.startswith("model_loaded")] == [
        "model_loaded:preload", "model_loaded:task", "model_loaded:prefetch",
        "model_loaded:arrival"]
    traced = [r.getMessage() for r in caplog.records if "cause" in r.getMessage()]
    assert len(traced) == 4 and "load of b, cause task" in traced[1]
    cache.clear()
    assert not cache.loads_by_cause
