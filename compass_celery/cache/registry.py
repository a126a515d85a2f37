"""Model registry: name -> how to build the model and how big it is declared to be.

Sizes are validated at registration so a model that can never fit is rejected
when it is registered or planned, not when a task first runs on a worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compass_celery.cache.errors import ModelTooLargeError, UnknownModelError

Loader = Callable[[], Any]


@dataclass(frozen=True)
class ModelSpec:
    """One registered model; ``size_mb`` is the declared size (the backend may measure it)."""

    name: str
    loader: Loader
    size_mb: float
    device: str | None = None
    #: Run on the model once it is on its device, as part of the load: first forward
    #: passes build kernels and optimise graphs, and would otherwise slow the first task.
    warmup: Callable[[Any], Any] | None = None


def _check_size(name: str, size_mb: float) -> float:
    try:
        size = float(size_mb)
    except (TypeError, ValueError):
        raise ValueError(f"model {name!r}: size_mb must be a number, got {size_mb!r}") from None
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"model {name!r}: size_mb must be finite and > 0, got {size_mb!r}")
    return size


class ModelRegistry:
    """Name -> :class:`ModelSpec`. Re-registering a name replaces it (latest wins)."""

    def __init__(self) -> None:
        self._specs: dict[str, ModelSpec] = {}

    def register(
        self, name: str, loader: Loader, size_mb: float, device: str | None = None,
        warmup: Callable[[Any], Any] | None = None,
    ) -> ModelSpec:
        """Declare ``name``: how to build it, its size, and optionally a warm-up run on the
        loaded model; re-registering replaces it."""
        if not name or not isinstance(name, str):
            raise ValueError(f"model name must be a non-empty string, got {name!r}")
        if not callable(loader):
            raise ValueError(f"model {name!r}: loader must be callable, got {loader!r}")
        if warmup is not None and not callable(warmup):
            raise ValueError(f"model {name!r}: warmup must be callable, got {warmup!r}")
        spec = ModelSpec(name, loader, _check_size(name, size_mb), device, warmup)
        self._specs[name] = spec
        return spec

    def model(
        self, name: str, size_mb: float, device: str | None = None
    ) -> Callable[[Loader], Loader]:
        """Decorator form: ``@registry.model("resnet", size_mb=100)`` over a loader."""

        def decorate(loader: Loader) -> Loader:
            self.register(name, loader, size_mb, device)
            return loader

        return decorate

    def get(self, name: str) -> ModelSpec:
        """The spec of ``name``; UnknownModelError naming the known models."""
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise UnknownModelError(
                f"model {name!r} has no loader in this process (models with one: {known}); "
                f"register it with @compass_celery.model({name!r}, size_mb=...) over a "
                f"function that returns it. A model named only in compass_models is placed "
                f"by its size, and your task's own code loads it") from None

    def unregister(self, name: str) -> None:
        """Forget ``name``; absent names are fine."""
        self._specs.pop(name, None)

    def sizes_mb(self) -> dict[str, float]:
        """Declared sizes, name -> MB (the planner's model catalogue)."""
        return {n: s.size_mb for n, s in self._specs.items()}

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._specs)

    def check_fits(self, name: str, capacity_mb: float) -> None:
        """Raise :class:`ModelTooLargeError` if ``name`` can never fit ``capacity_mb``."""
        size = self.get(name).size_mb
        if size > capacity_mb:
            raise ModelTooLargeError(
                f"model {name!r} ({size:.1f} MB) can never fit in {capacity_mb:.1f} MB of memory"
            )

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)


default_registry = ModelRegistry()
"""The process-wide registry ``get_model`` and the worker cache use unless given another."""
