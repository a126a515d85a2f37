"""ModelCache: runs CacheDecider's actions on a backend, thread-safely, with prefetch.

Decisions are taken under one lock and applied to the decider at once (memory is
reserved before a load starts), while the slow part, the load itself, runs outside
the lock, so a task that holds its model is never blocked by a background prefetch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from compass_celery.cache.backends import Backend
from compass_celery.cache.decisions import CacheDecider, Evict, Load
from compass_celery.cache.errors import CacheFullError, ModelTooLargeError
from compass_celery.cache.registry import ModelRegistry, default_registry

log = logging.getLogger(__name__)

#: Why a load was made: a task found its model missing (``task``), a background prefetch
#: for queued tasks (``prefetch``, or the cause its caller names), or a preload at start
#: (``preload``: ``compass_preload``, an autoscaler's hint included). A load retried after
#: running out of memory keeps its cause.
LOAD_CAUSES = ("task", "prefetch", "preload")


class ModelCache:
    """The worker's GPU model cache. Sizes in MB; ``now`` is ``time.monotonic()``."""

    def __init__(
        self,
        backend: Backend,
        capacity_mb: float | None = None,
        policy: str = "lookahead",
        lookahead: int = 3,
        sizes: Mapping[str, float] | None = None,
        registry: ModelRegistry = default_registry,
        on_change: Callable[[], None] | None = None,
        on_event: Callable[[str, dict], None] | None = None,
    ) -> None:
        self.backend, self.registry, self.lookahead = backend, registry, lookahead
        self.on_change, self.on_event = on_change, on_event
        self._sizes = {**registry.sizes_mb(), **(sizes or {})}
        cap = backend.total_mb() if capacity_mb is None else capacity_mb
        self.decider = CacheDecider(cap, policy, self._sizes)
        self._cond = threading.Condition(threading.RLock())
        self._in_use: Counter[str] = Counter()
        self._threads: list[threading.Thread] = []
        # The model of the task started last: protected from prefetch evictions even
        # after an early release (get_model releases at once), until the next acquire.
        self._current: str | None = None
        # Loads under way: model -> (wall time it began, when it should end), published so
        # plans count what is left of it; and how long each model's last load took here
        # (real s), by whether it came from the host tier, for the next one's end.
        self._in_flight: dict[str, tuple[float, float]] = {}
        self._took_s: dict[tuple[str, bool], float] = {}
        self.hits = self.misses = self.loads = self.evictions = 0
        #: Loads by why they were made (:data:`LOAD_CAUSES`), to explain a cluster's loads.
        self.loads_by_cause: Counter[str] = Counter()

    # -- state ----------------------------------------------------------------
    @property
    def device(self) -> str:
        """The backend's device ("cuda:0", "cpu", "emulated")."""
        return self.backend.device

    @property
    def total_mb(self) -> float:
        """Memory the cache may fill, MB."""
        return self.decider.capacity_mb

    @property
    def free_mb(self) -> float:
        """Memory free for models now, MB: the decider's count or the device's, the lower."""
        with self._cond:
            # the backend's real free memory wins when it is lower (CUDA, other processes)
            return min(self.decider.free_mb(), self.backend.free_mb())

    @property
    def hit_rate(self) -> float:
        """Hits over hits + misses since start or the last clear (0 before any)."""
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    def resident(self) -> dict[str, float]:
        """Models resident now, name -> MB."""
        with self._cond:
            return dict(self.decider.resident)

    def loading(self) -> dict[str, float]:
        """Models being loaded now; their memory is already reserved (not in ``free_mb``)."""
        with self._cond:
            return dict(self.decider.loading)

    def in_flight(self) -> dict[str, tuple[float, float]]:
        """Loads under way whose length can be told (measured before here, or the backend
        says): model -> (wall time it began, when it should end), ``time.time()`` s."""
        with self._cond:
            return dict(self._in_flight)

    def host_resident(self) -> dict[str, float]:
        """Models in the backend's host-RAM tier, name -> MB."""
        return self.backend.host_resident()

    def size_of(self, model: str) -> float:
        """The model's size, MB: measured once loaded, else declared."""
        if model in self._sizes:
            return self._sizes[model]
        return self.registry.get(model).size_mb  # raises UnknownModelError naming the model

    def loadable(self, model: str) -> bool:
        """Whether this cache can make ``model`` resident: an emulated backend can load any
        model with a size; a real one needs the model's loader in the registry. A model
        declared only by size (``compass_models``) is placed, but loaded by the task's own
        code."""
        return not self.backend.needs_loader or model in self.registry

    def check_fits(self, model: str) -> None:
        """Raise ModelTooLargeError if ``model`` can never fit this device."""
        size = self.size_of(model)
        if size > self.total_mb:
            raise ModelTooLargeError(
                f"model {model!r} ({size:.1f} MB) can never fit in {self.total_mb:.1f} MB "
                f"on {self.device}"
            )

    def set_rank(self, rank: Mapping[str, tuple[float, ...]]) -> None:
        """Follow the planner's eviction order (``planner.evict.eviction_rank``) among
        victims no queued task needs; empty: recency alone (``CacheDecider.rank``)."""
        with self._cond:
            self.decider.rank = rank

    # -- use ------------------------------------------------------------------
    def acquire(self, model: str, queued: Sequence[str | None] = ()) -> Any:
        """Return ``model`` resident on the device, loading (and evicting) as the decider says.

        The model stays protected from eviction until :meth:`release`.
        """
        return self._acquire(model, queued, count=True)

    def _acquire(self, model: str, queued: Sequence[str | None], count: bool) -> Any:
        cause = "task" if count else "preload"
        self.check_fits(model)
        loaded_here = False
        with self._cond:
            while True:
                if self.decider.is_resident(model):
                    if count and not loaded_here:
                        self.hits += 1
                    self._in_use[model] += 1
                    self._current = model
                    self.decider.on_used(model, time.monotonic())
                    return self.backend.get(model)
                if model in self.decider.loading:  # a prefetch or another thread is on it
                    self._cond.wait()
                    continue
                self.misses += count
                loaded_here = True
                actions = self.decider.on_need(
                    model, self.size_of(model), queued, self._running(), time.monotonic()
                )
                self._execute(actions, queued, retry=True, cause=cause)

    def held(self, model: str) -> bool:
        """Whether ``model`` is acquired and not yet released (so it is resident)."""
        with self._cond:
            return self._in_use[model] > 0

    def release(self, model: str) -> None:
        """Undo one acquire: once no task holds it, the model may be evicted."""
        with self._cond:
            if self._in_use[model] > 0:
                self._in_use[model] -= 1
            if self._in_use[model] == 0:
                del self._in_use[model]

    def prefetch(self, queued: Sequence[str | None], cause: str = "prefetch") -> list[str]:
        """Start loading the next queued tasks' models in the background; return their names.
        A model this cache cannot load (no loader) is left to its task's own code. ``cause``
        names the loads' reason in :attr:`loads_by_cause` and the trace."""
        queued = [m if m is None or self.loadable(m) else None for m in queued]
        with self._cond:
            actions = self.decider.prefetch(
                queued,
                self._running() | ({self._current} - {None}),
                self.lookahead,
                time.monotonic(),
            )
            self._evict([a.name for a in actions if isinstance(a, Evict)])
            loads = [a for a in actions if isinstance(a, Load)]
        if loads:
            t = threading.Thread(
                target=self._load_all, args=(loads, queued, cause), daemon=True,
                name="compass-prefetch",
            )
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()
        return [a.name for a in loads]

    def preload(self, models: Iterable[str]) -> None:
        """Load ``models`` now (e.g. at worker start), without counting hits or misses."""
        for m in models:
            self._acquire(m, (), count=False)
            self.release(m)

    def wait_prefetch(self, timeout: float | None = None) -> None:
        """Wait for background prefetch loads to finish (tests, shutdown)."""
        for t in list(self._threads):
            t.join(timeout)

    def clear(self) -> None:
        """Empty both tiers and reset stats (between benchmark runs)."""
        self.wait_prefetch()
        with self._cond:
            self.decider.clear()
            self.backend.clear()
            self._in_use.clear()
            self._in_flight.clear()
            self._current = None
            self.hits = self.misses = self.loads = self.evictions = 0
            self.loads_by_cause.clear()
        self._changed()

    @contextmanager
    def using(self, model: str, queued: Sequence[str | None] = ()) -> Iterator[Any]:
        """``with cache.using("m") as m:``, acquire for the block, release after."""
        obj = self.acquire(model, queued)
        try:
            yield obj
        finally:
            self.release(model)

    def run(self, exec_ms: float) -> None:
        """Spend a task's run time on the backend (emulated GPUs sleep; torch does nothing)."""
        self.backend.run(exec_ms)

    # -- internals --------------------------------------------------------------
    def _running(self) -> set[str]:
        return {m for m, n in self._in_use.items() if n > 0}

    def _execute(self, actions: list, queued: Sequence[str | None], retry: bool,
                 cause: str) -> None:
        """Called with the lock held; loads release it while they run."""
        self._evict([a.name for a in actions if isinstance(a, Evict)])
        for a in actions:
            if isinstance(a, Load):
                self._load(a, queued, retry, cause)

    def _load_all(self, loads: list[Load], queued: Sequence[str | None], cause: str) -> None:
        for a in loads:
            with self._cond:
                try:
                    self._load(a, queued, retry=False, cause=cause)
                except Exception as exc:  # a failed prefetch is only a missed chance
                    log.warning("prefetch of %s failed: %s", a.name, exc)

    def _warm(self, spec: Any, model: Any) -> None:
        """The model's warm-up run, on its device, inside the load's time; a failed one
        takes the model off the device again and fails the load."""
        try:
            spec.warmup(model)
        except BaseException:
            self.backend.evict(spec.name)
            raise

    def _load(self, a: Load, queued: Sequence[str | None], retry: bool, cause: str) -> None:
        spec = self.registry.get(a.name) if a.name in self.registry else None
        from_host = a.name in self.backend.host_resident()
        t0 = time.monotonic()
        self._began(a, from_host)
        self._cond.release()
        try:
            model, mb = self.backend.load(a.name, spec.loader if spec else None, a.size_mb)
            if spec is not None and spec.warmup is not None and self.backend.needs_loader:
                self._warm(spec, model)
        except BaseException as exc:
            self._cond.acquire()
            self._in_flight.pop(a.name, None)
            self.decider.on_load_failed(a.name)
            self._cond.notify_all()
            if not self.backend.is_oom(exc):
                raise
            if not retry:
                raise CacheFullError(self._full_msg(a)) from exc
            self._evict(self.decider.victims(self._running(), queued))
            actions = self.decider.on_need(
                a.name, a.size_mb, queued, self._running(), time.monotonic()
            )
            self._execute(actions, queued, retry=False, cause=cause)
            return
        self._cond.acquire()
        del model
        self.loads += 1
        self.loads_by_cause[cause] += 1
        self._in_flight.pop(a.name, None)
        took = self._took_s[(a.name, from_host)] = time.monotonic() - t0
        log.debug("compass: load of %s, cause %s, %.0f ms%s; loads by cause %s", a.name,
                  cause, 1000 * took, " (from host memory)" if from_host else "",
                  dict(self.loads_by_cause))
        self._sizes[a.name] = mb
        self._evict(
            [
                e.name
                for e in self.decider.on_loaded(
                    a.name, mb, time.monotonic(), self._running(), queued
                )
            ]
        )
        self._cond.notify_all()
        self._emit(
            "model_loaded",
            model=a.name,
            size_mb=mb,
            declared_mb=a.size_mb,
            ms=1000 * (time.monotonic() - t0),
            from_host=from_host,
            cause=cause,
        )
        self._changed()

    def _began(self, a: Load, from_host: bool) -> None:
        """Note a load under way (lock held) and publish it, when its length can be told:
        the last load of the model here, else what the backend says."""
        took = self._took_s.get((a.name, from_host))
        if took is None:
            took = self.backend.expected_load_s(a.name, a.size_mb)
        if took is not None:
            now = time.time()
            self._in_flight[a.name] = (now, now + took)
            self._changed()

    def _full_msg(self, a: Load) -> str:
        return (
            f"cannot load model {a.name!r} ({a.size_mb:.1f} MB) on {self.device}: "
            f"out of memory after evicting, {self.backend.free_mb():.1f} MB free"
        )

    def _evict(self, names: list[str]) -> None:
        for name in names:
            self.decider.on_evicted(name)
            self.backend.evict(name)
            self.evictions += 1
            self._emit("model_evicted", model=name)
            self._changed()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, fields)
            except Exception:  # a listener never fails a task
                log.exception("cache on_event listener failed")

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("cache on_change listener failed")
