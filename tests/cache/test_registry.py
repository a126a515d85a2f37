"""ModelRegistry: registration, decorator form, errors that name the model."""

from __future__ import annotations

import math

import pytest

from compass_celery.cache import ModelRegistry, ModelTooLargeError, UnknownModelError


def test_register_get_and_decorator() -> None:
    reg = ModelRegistry()
    reg.register("a", object, 10)

    @reg.model("b", size_mb=20.5, device="cuda")
    def load_b() -> str:
        return "b"

    assert reg.get("b").loader is load_b and reg.get("b").device == "cuda"
    assert reg.sizes_mb() == {"a": 10.0, "b": 20.5}
    assert "a" in reg and len(reg) == 2


def test_unknown_model_names_it_and_known_ones() -> None:
    reg = ModelRegistry()
    reg.register("alpha", object, 1)
    with pytest.raises(UnknownModelError, match=r"'beta'.*alpha") as info:
        reg.get("beta")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("size", [0, -1, math.inf, math.nan, "x"])
def test_bad_size_is_rejected_at_registration(size: object) -> None:
    with pytest.raises(ValueError, match="'bad'"):
        ModelRegistry().register("bad", object, size)  # type: ignore[arg-type]


def test_never_fits_is_rejected_early() -> None:
    reg = ModelRegistry()
    reg.register("huge", object, 2000)
    reg.check_fits("huge", 2000)
    with pytest.raises(ModelTooLargeError, match=r"'huge' \(2000\.0 MB\).*1600\.0 MB"):
        reg.check_fits("huge", 1600)


def test_an_emulated_gpu_hands_tasks_the_real_model_when_it_has_a_loader() -> None:
    """Emulated memory and load time, but the task body gets what the loader built, so
    the README's task runs unchanged on emulated workers (the test plugin's cluster)."""
    from compass_celery.cache import EmulatedBackend, EmulatedModel, ModelCache, ModelRegistry

    registry = ModelRegistry()
    registry.register("real", lambda: {"weights": [1, 2, 3]}, size_mb=100)
    cache = ModelCache(EmulatedBackend(1000, time_scale=0.0), registry=registry,
                       sizes={"size-only": 50})
    assert cache.acquire("real") == {"weights": [1, 2, 3]}
    assert cache.free_mb == 900  # the declared size is what the emulated GPU counts
    assert isinstance(cache.acquire("size-only"), EmulatedModel)
