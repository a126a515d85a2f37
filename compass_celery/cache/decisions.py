"""Pure cache decisions: a small state object fed events, answering with actions.

Like dask's ``WorkerState``: no torch, Celery, Redis or clocks here (``now`` is
passed in), so the real cache, the emulated benchmark and the simulator all run
this exact code. The decider applies its own decisions at once (an ``Evict`` is
gone from ``resident``, a ``Load`` is reserved as loading), so memory accounting
stays within capacity even while loads run in the background; callers confirm
with :meth:`on_loaded` / :meth:`on_load_failed` and report outside evictions
with :meth:`on_evicted`. Sizes in MB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from compass_celery.cache.errors import CacheFullError

POLICIES = ("lookahead", "lru", "fifo")


@dataclass(frozen=True)
class Load:
    """Load model ``name`` (``size_mb``) onto the GPU."""

    name: str
    size_mb: float


@dataclass(frozen=True)
class Evict:
    """Drop model ``name`` from the GPU (the backend may keep it in host RAM)."""

    name: str


Action = Load | Evict


def _running(running: str | Iterable[str] | None) -> set[str]:
    """The model(s) in use now: one name, several (threads), or none."""
    if running is None:
        return set()
    return {running} if isinstance(running, str) else set(running)


def _first_use(queued: Iterable[str | None]) -> dict[str, int]:
    """Model -> index of the first queued task that needs it."""
    first: dict[str, int] = {}
    for i, m in enumerate(queued):
        if m is not None and m not in first:
            first[m] = i
    return first


class CacheDecider:
    """Which models to load and evict on one device of ``capacity_mb``."""

    def __init__(
        self,
        capacity_mb: float,
        policy: str = "lookahead",
        sizes: Mapping[str, float] | None = None,
    ) -> None:
        if policy not in POLICIES:
            known = ", ".join(POLICIES)
            raise ValueError(f"unknown cache policy {policy!r}; choose one of {known}")
        if not math.isfinite(capacity_mb) or capacity_mb <= 0:
            raise ValueError(f"cache capacity_mb must be finite and > 0, got {capacity_mb!r}")
        self.capacity_mb = float(capacity_mb)
        self.policy = policy
        self.sizes: dict[str, float] = dict(sizes or {})
        self.resident: dict[str, float] = {}
        self.loading: dict[str, float] = {}
        self._last_use: dict[str, float] = {}
        self._load_seq: dict[str, int] = {}
        self._seq = 0
        #: Model -> sort key among victims no queued task needs, lowest evicted first,
        #: before recency (lookahead only). The planner's ``planner.evict.eviction_rank``:
        #: spare copies (the model has more replicas than its demand needs) go before
        #: kept ones, so the cache evicts what the plan expected. Empty: LRU as before.
        self.rank: Mapping[str, tuple[float, ...]] = {}
        #: Models never offered as eviction victims (the simulator's static-replicas
        #: reference preloads its assignment and pins it). Empty: nothing is pinned.
        self.pinned: frozenset[str] = frozenset()

    # -- accounting ---------------------------------------------------------
    def resident_mb(self) -> float:
        """MB held by resident models and by loads under way (both occupy memory)."""
        return sum(self.resident.values()) + sum(self.loading.values())

    def free_mb(self) -> float:
        """MB neither resident nor reserved by a load."""
        return self.capacity_mb - self.resident_mb()

    def is_resident(self, name: str) -> bool:
        """Whether ``name`` is loaded (not merely loading)."""
        return name in self.resident

    # -- eviction order -----------------------------------------------------
    def _victims(
        self, protected: set[str], queued: Sequence[str | None], allow_needed: bool
    ) -> list[str]:
        """Evictable resident models, best victim first, under this policy."""
        pinned = self.pinned
        cands = [m for m in self.resident if m not in protected and m not in pinned]
        if self.policy == "fifo":
            return sorted(cands, key=lambda m: self._load_seq[m])
        if self.policy == "lru":
            return sorted(
                cands, key=lambda m: (self._last_use.get(m, -math.inf), self._load_seq[m])
            )
        first = _first_use(queued)
        if not allow_needed:
            cands = [m for m in cands if m not in first]
        rank, none = self.rank, (0.0, 0.0, 0.0)

        def key(m: str) -> tuple[float, ...]:
            lru = (self._last_use.get(m, -math.inf), self._load_seq[m])
            if m not in first:
                return (0, 0.0, *rank.get(m, none), *lru)
            return (1, -first[m], *none, *lru)  # needed latest goes first

        return sorted(cands, key=key)

    def _make_room(
        self,
        name: str,
        size: float,
        protected: set[str],
        queued: Sequence[str | None],
        allow_needed: bool,
    ) -> list[Evict] | None:
        """Evictions that free ``size`` MB, or None if impossible (state untouched).

        Victims are taken in eviction order until there is room; then any taken earlier
        that the room no longer needs (a small model ahead of the big one that made room)
        is spared, the most valuable first, so no model is unloaded for nothing; never
        one no queued task needs while a needed one goes instead."""
        free = self.free_mb()
        out: list[Evict] = []
        for victim in self._victims(protected, queued, allow_needed):
            if free >= size:
                break
            free += self.resident[victim]
            out.append(Evict(victim))
        if free < size:
            return None
        needed = set(queued)
        for k in range(len(out) - 2, -1, -1):
            e = out[k]
            # never keep a model no queued task needs at the cost of one that is needed
            later_needed = any(x.name in needed for x in out[k + 1:])
            if (e.name in needed or not later_needed) and \
                    free - self.resident[e.name] >= size:
                free -= self.resident[e.name]
                del out[k]
        return out

    def _apply(self, actions: list[Action], now: float) -> list[Action]:
        for a in actions:
            if isinstance(a, Evict):
                self.resident.pop(a.name, None)
            else:
                self.loading[a.name] = a.size_mb
                self._last_use[a.name] = now
        return actions

    # -- events -------------------------------------------------------------
    def on_need(
        self,
        model: str,
        size_mb: float | None = None,
        queued: Sequence[str | None] = (),
        running: str | Iterable[str] | None = None,
        now: float = 0.0,
    ) -> list[Action]:
        """A task needing ``model`` is about to run; return the actions that make it resident.

        Returns ``[]`` when it is resident or already loading (the caller waits).
        Raises :class:`CacheFullError` when it cannot fit even after every allowed eviction.
        """
        if model in self.resident or model in self.loading:
            self._last_use[model] = now
            return []
        size = self._size(model, size_mb)
        if size > self.capacity_mb:
            raise CacheFullError(
                f"model {model!r} ({size:.1f} MB) can never fit: capacity {self.capacity_mb:.1f} MB"
            )
        protected = {model, *self.loading} | _running(running)
        evicts = self._make_room(model, size, protected, queued, allow_needed=True)
        if evicts is None:
            raise CacheFullError(
                f"cannot load model {model!r} ({size:.1f} MB): {self.free_mb():.1f} MB free of "
                f"{self.capacity_mb:.1f} MB and the rest is in use or loading"
            )
        return self._apply([*evicts, Load(model, size)], now)

    def prefetch(
        self,
        queued: Sequence[str | None],
        running: str | Iterable[str] | None = None,
        lookahead: int = 3,
        now: float = 0.0,
    ) -> list[Action]:
        """Load the next ``lookahead`` queued tasks' missing models within free memory.

        May evict only models no running or queued task needs; stops at the first
        model that cannot be made room for, so an earlier task never loses memory
        to a later one.
        """
        protected = set(_first_use(queued)) | set(self.loading) | _running(running)
        out: list[Action] = []
        for model in dict.fromkeys(m for m in list(queued)[:lookahead] if m is not None):
            if model in self.resident or model in self.loading or model not in self.sizes:
                continue
            size = self.sizes[model]
            evicts = self._make_room(model, size, protected, queued, allow_needed=False)
            if size > self.capacity_mb or evicts is None:
                break
            out += self._apply([*evicts, Load(model, size)], now)
        return out

    def on_loaded(
        self,
        name: str,
        size_mb: float | None = None,
        now: float = 0.0,
        protect: Iterable[str] = (),
        queued: Sequence[str | None] = (),
    ) -> list[Evict]:
        """A load finished; ``size_mb`` is the measured size, which wins over the declared one.

        If the measured size overflows capacity, returns the evictions that fix it.
        """
        reserved = self.loading.pop(name, None)
        if size_mb is not None:
            size = float(size_mb)
        else:
            size = reserved if reserved is not None else self.sizes.get(name, 0.0)
        self.sizes[name] = size
        self.resident[name] = size
        self._seq += 1
        self._load_seq[name] = self._seq
        self._last_use.setdefault(name, now)
        if self.free_mb() >= 0:
            return []
        evicts = self._make_room(name, 0.0, {name, *protect, *self.loading}, queued, True) or []
        self._apply(list(evicts), now)
        return evicts

    def on_load_failed(self, name: str) -> None:
        """A load did not happen: release its reservation."""
        self.loading.pop(name, None)

    def on_evicted(self, name: str) -> None:
        """The backend dropped ``name`` (e.g. after a real OOM): forget it."""
        self.resident.pop(name, None)
        self.loading.pop(name, None)

    def on_used(self, name: str, now: float) -> None:
        """A task ran on ``name`` at ``now`` (LRU and lookahead read it)."""
        self._last_use[name] = now

    def victims(
        self, running: str | Iterable[str] | None = None, queued: Sequence[str | None] = ()
    ) -> list[str]:
        """Every resident model that may go now, best victim first (used on a real OOM)."""
        return self._victims(_running(running) | set(self.loading), queued, allow_needed=True)

    def clear(self) -> list[Evict]:
        """Forget every resident model; the evictions the backend must carry out."""
        out = [Evict(m) for m in self.resident]
        self.resident.clear()
        return out

    def _size(self, model: str, size_mb: float | None) -> float:
        if size_mb is not None:
            return self.sizes.setdefault(model, float(size_mb))  # a measured size wins
        try:
            return self.sizes[model]
        except KeyError:
            raise CacheFullError(f"model {model!r} has no known size") from None
