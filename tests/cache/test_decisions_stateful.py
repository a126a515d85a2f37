"""CacheDecider held to its invariants under random event sequences (hypothesis)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from compass_celery.cache.decisions import CacheDecider, Evict, Load
from compass_celery.cache.errors import CacheFullError

SIZES = {"m0": 10.0, "m1": 25.0, "m2": 40.0, "m3": 55.0, "m4": 70.0, "m5": 15.0}
CAPACITY = 100.0
models = st.sampled_from(sorted(SIZES))


class DeciderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.d = CacheDecider(CAPACITY, "lookahead", SIZES)
        self.now = 0.0
        self.running: str | None = None

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    @rule(
        model=models,
        queued=st.lists(models, max_size=5),
        measured=st.none() | st.floats(0.5, 1.0),
    )
    def need(self, model: str, queued: list[str], measured: float | None) -> None:
        """``measured`` scales the declared size (measured-larger is unit-tested separately)."""
        before = dict(self.d.resident)
        needed = set(queued)
        try:
            acts = self.d.on_need(model, queued=queued, running=self.running, now=self._tick())
        except CacheFullError:
            assert self.d.resident == before
            return
        gone = [a.name for a in acts if isinstance(a, Evict)]
        assert self.running not in gone
        # a model a queued task needs goes only when no unneeded one is left to go
        if any(g in needed for g in gone):
            left = set(self.d.resident) - needed - {model, self.running}
            assert not left, f"evicted needed {gone} while {left} could go"
        for a in acts:
            if isinstance(a, Load):
                mb = None if measured is None else a.size_mb * measured
                protect = [model] if self.running is None else [model, self.running]
                self.d.on_loaded(a.name, mb, now=self.now, protect=protect, queued=queued)
        if model in self.d.resident:
            self.running = model

    @rule(queued=st.lists(models, max_size=5))
    def prefetch(self, queued: list[str]) -> None:
        acts = self.d.prefetch(queued, running=self.running, lookahead=3, now=self._tick())
        for a in acts:
            if isinstance(a, Evict):
                assert a.name not in set(queued) | {self.running}
        for a in acts:
            if isinstance(a, Load):
                self.d.on_loaded(a.name, now=self.now)

    @precondition(lambda self: self.running is not None)
    @rule()
    def finish(self) -> None:
        self.running = None

    @rule(model=models)
    def evicted_outside(self, model: str) -> None:
        if model != self.running:
            self.d.on_evicted(model)

    @invariant()
    def within_capacity(self) -> None:
        assert self.d.resident_mb() <= CAPACITY + 1e-9
        assert abs(self.d.free_mb() + self.d.resident_mb() - CAPACITY) < 1e-9

    @invariant()
    def nothing_left_loading(self) -> None:
        assert not self.d.loading


DeciderMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestDecider = DeciderMachine.TestCase
