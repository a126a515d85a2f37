"""GPU model cache: registry, torch and emulated backends, lookahead eviction, prefetch.

Task code calls :func:`get_model`; the worker bootstep installs the process's cache
with :func:`set_current_cache` (after the pool fork, so CUDA is never touched in the
parent). Without one, a CPU torch cache over ``default_registry`` is made on first use.
"""

from __future__ import annotations

import threading
from typing import Any

from compass_celery.cache.backends import Backend, EmulatedBackend, EmulatedModel, TorchBackend
from compass_celery.cache.decisions import POLICIES, CacheDecider, Evict, Load
from compass_celery.cache.errors import CacheFullError, ModelTooLargeError, UnknownModelError
from compass_celery.cache.host_tier import HostTier
from compass_celery.cache.manager import ModelCache
from compass_celery.cache.registry import ModelRegistry, ModelSpec, default_registry

__all__ = [
    "POLICIES",
    "Backend",
    "CacheDecider",
    "CacheFullError",
    "EmulatedBackend",
    "EmulatedModel",
    "Evict",
    "HostTier",
    "Load",
    "ModelCache",
    "ModelRegistry",
    "ModelSpec",
    "ModelTooLargeError",
    "TorchBackend",
    "UnknownModelError",
    "current_cache",
    "default_registry",
    "get_model",
    "model",
    "set_current_cache",
]

_current: ModelCache | None = None
_lock = threading.Lock()


def set_current_cache(cache: ModelCache | None) -> None:
    """Install (or with None, remove) this process's cache; called by the worker bootstep."""
    global _current
    with _lock:
        _current = cache


def current_cache() -> ModelCache:
    """This process's cache, creating a CPU torch cache over ``default_registry`` if unset."""
    global _current
    with _lock:
        if _current is None:
            _current = ModelCache(TorchBackend("cpu"), registry=default_registry)
        return _current


def get_model(name: str) -> Any:
    """The resident model ``name`` from this process's cache (loaded on a miss).

    Inside a task the worker runtime has already acquired the task's model, so it is
    returned as it is, without counting a second hit. Otherwise it is acquired (a
    hit or a miss) and released at once, but the cache keeps treating it as the
    running task's model (prefetch never evicts it) until the next acquire, which is
    enough for the one-task-at-a-time pools Compass GPU workers use. Threads sharing
    one cache should use ``current_cache().using(name)`` instead.
    """
    cache = current_cache()
    if cache.held(name):  # held until released: resident and safe from eviction
        return cache.backend.get(name)
    model = cache.acquire(name)
    cache.release(name)
    return model


def model(name: str, *, size_mb: float, device: str | None = None) -> Any:
    """Register a loader for model ``name`` (a decorator): the function takes no arguments
    and returns the model, built on the CPU; the worker's cache moves a torch module to
    its device, measures it, and hands it to tasks through :func:`get_model`.

    ``size_mb`` is what the planner counts before the first load (the worker then counts
    the measured size). Register it where the worker and the web app both import it, next
    to the app. Registering a name again replaces it.
    """
    return default_registry.model(name, size_mb, device)
