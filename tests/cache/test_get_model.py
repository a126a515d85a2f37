"""get_model inside a task: no second access for a model the worker runtime holds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compass_celery.cache import (
    EmulatedBackend,
    EmulatedModel,
    ModelCache,
    ModelRegistry,
    get_model,
    set_current_cache,
)

SIZES = {"a": 40.0, "b": 30.0}


@pytest.fixture
def cache() -> Iterator[ModelCache]:
    c = ModelCache(EmulatedBackend(100, load_mb_per_s=1000, time_scale=0.0), 100,
                   sizes=SIZES, registry=ModelRegistry())
    set_current_cache(c)
    yield c
    set_current_cache(None)


def stats(c: ModelCache) -> tuple[int, int, int]:
    return c.hits, c.misses, c.loads


def run_task(c: ModelCache, model: str, calls: int = 1) -> list[object]:
    """What WorkerRuntime does around a task body: acquire, body, release."""
    c.acquire(model)
    try:
        return [get_model(model) for _ in range(calls)]
    finally:
        c.release(model)


def test_task_counts_one_access_not_two(cache: ModelCache) -> None:
    assert run_task(cache, "a") == [EmulatedModel("a", 40.0)]
    assert stats(cache) == (0, 1, 1)  # the runtime's miss only
    run_task(cache, "a", calls=3)  # however often the body asks
    assert stats(cache) == (1, 1, 1)
    run_task(cache, "b")
    assert stats(cache) == (1, 2, 2) and cache.hit_rate == pytest.approx(1 / 3)


def test_held_model_is_the_resident_object(cache: ModelCache) -> None:
    held = cache.acquire("a")
    assert cache.held("a") and not cache.held("b")
    assert get_model("a") is held is cache.backend.get("a")
    cache.release("a")
    assert not cache.held("a")


def test_not_held_behaves_as_before(cache: ModelCache) -> None:
    # outside a runtime-acquired task: get_model counts (and loads on a miss) as it always has
    assert get_model("a") == EmulatedModel("a", 40.0)
    assert stats(cache) == (0, 1, 1) and not cache.held("a")
    get_model("a")
    assert stats(cache) == (1, 1, 1)
    # it still protects the model of the task started last from prefetch evictions
    assert cache.prefetch(["b"]) == ["b"]
    cache.wait_prefetch()
    assert set(cache.resident()) == {"a", "b"}


def test_held_by_nested_acquires_until_last_release(cache: ModelCache) -> None:
    cache.acquire("a")
    cache.acquire("a")
    cache.release("a")
    get_model("a")
    assert cache.held("a") and stats(cache) == (1, 1, 1)
    cache.release("a")
    get_model("a")  # no longer held: counted
    assert stats(cache) == (2, 1, 1)
