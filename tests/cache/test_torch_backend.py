"""TorchBackend with the real example models: load, measure, evict, free.

The same bodies run on ``cpu`` everywhere and on ``cuda`` where a GPU exists.
"""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from compass_celery.cache import (  # noqa: E402
    CacheFullError,
    ModelCache,
    ModelRegistry,
    TorchBackend,
    get_model,
    set_current_cache,
)
from compass_celery.cache.backends import _module_mb  # noqa: E402
from workers.models import EXAMPLES, forward, register_example_models  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]
SMALL = ("image-classifier", "detector", "text-encoder")  # the translator is exercised elsewhere


@pytest.fixture
def registry() -> ModelRegistry:
    reg = ModelRegistry()
    register_example_models(reg)
    return reg


@pytest.mark.parametrize("device", DEVICES)
def test_load_measure_evict_free(device: str, registry: ModelRegistry) -> None:
    cache = ModelCache(TorchBackend(device, capacity_mb=50), registry=registry)
    assert cache.total_mb == 50
    refs = {}
    for name in SMALL:
        model = cache.acquire(name)
        assert not model.training and next(model.parameters()).device.type == device
        params = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6  # MB
        assert cache.resident()[name] == pytest.approx(params, rel=0.02)  # measured, not declared
        refs[name] = weakref.ref(model)
        del model
        cache.release(name)
    # 4.9 + 15.6 + 39 (declared) MB > 50: the detector went to make room for the encoder;
    # the classifier, oldest but too small to make room alone, was spared
    assert set(cache.resident()) == {"image-classifier", "text-encoder"}
    assert cache.evictions == 1
    assert cache.free_mb == pytest.approx(50 - sum(cache.resident().values()))
    if device == "cpu":
        gc.collect()
        assert refs["detector"]() is None
        assert cache.host_resident() == {}
    else:
        assert set(cache.host_resident()) == {"detector"}
    cache.clear()
    gc.collect()
    assert cache.resident() == {} and refs["text-encoder"]() is None
    assert refs["image-classifier"]() is None
    if device == "cpu":
        assert cache.backend.free_mb() == pytest.approx(50)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_passes_are_jsonable(device: str, registry: ModelRegistry) -> None:
    import json

    cache = ModelCache(TorchBackend(device), registry=registry)
    inputs = {"image-classifier": [0.1] * 50, "detector": [0.2] * 50, "text-encoder": [5, 9, 7]}
    for name in SMALL:
        out = forward(name, cache.acquire(name), inputs[name])
        cache.release(name)
        assert json.loads(json.dumps(out)) == out


def test_translator_and_declared_sizes_are_close(registry: ModelRegistry) -> None:
    for name, (build, declared, _) in EXAMPLES.items():
        assert _module_mb(build()) == pytest.approx(declared, rel=0.15), name
    cache = ModelCache(TorchBackend("cpu"), registry=registry)
    out = forward("translator", cache.acquire("translator"), [3, 4, 5])
    assert out and all(isinstance(t, int) for t in out)


def test_cpu_oom_gives_cache_full_naming_model(registry: ModelRegistry) -> None:
    def boom() -> object:
        raise MemoryError("host out of memory")

    registry.register("greedy", boom, 10)
    cache = ModelCache(TorchBackend("cpu", capacity_mb=100), registry=registry)
    cache.acquire("image-classifier")
    with pytest.raises(CacheFullError, match=r"'greedy' \(10\.0 MB\).*MB free"):
        cache.acquire("greedy")
    assert "greedy" not in cache.resident() and not cache.loading()


def test_get_model_uses_current_cache(registry: ModelRegistry) -> None:
    cache = ModelCache(TorchBackend("cpu"), registry=registry)
    set_current_cache(cache)
    try:
        assert get_model("image-classifier") is cache.backend.get("image-classifier")
        assert cache.misses == 1
    finally:
        set_current_cache(None)
