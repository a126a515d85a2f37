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
