"""CacheDecider: eviction order per policy, protection of queued/running models, prefetch."""

from __future__ import annotations

import pytest

from compass_celery.cache.decisions import CacheDecider, Evict, Load
from compass_celery.cache.errors import CacheFullError

SIZES = {"a": 40.0, "b": 30.0, "c": 30.0, "d": 50.0, "e": 30.0, "big": 120.0}


def filled(policy: str, order: tuple[str, ...] = ("a", "b", "c")) -> CacheDecider:
    """A 100 MB decider with ``order`` loaded at times 0, 1, 2 and used in that order."""
    d = CacheDecider(100, policy, SIZES)
    for t, m in enumerate(order):
        for act in d.on_need(m, now=t):
            if isinstance(act, Load):
                d.on_loaded(act.name, now=t)
    return d


def evicted(actions: list) -> list[str]:
    return [a.name for a in actions if isinstance(a, Evict)]


def test_load_then_hit() -> None:
    d = CacheDecider(100, sizes=SIZES)
    assert d.on_need("a") == [Load("a", 40.0)]
    assert d.free_mb() == 60  # reserved while loading
    d.on_loaded("a")
    assert d.on_need("a") == []
    assert d.resident == {"a": 40.0}


def test_lookahead_evicts_unneeded_model_first() -> None:
    d = filled("lookahead")
    # a is least recently used but a queued task needs it; b is not needed
    acts = d.on_need("e", queued=["a", "c"], now=10)
    assert evicted(acts) == ["b"]
    assert d.resident_mb() <= 100


def test_lookahead_evicts_model_needed_latest() -> None:
    d = filled("lookahead")
    acts = d.on_need("d", queued=["c", "x", "b", "a"], now=10)
    # all needed: a is needed latest (index 3), then b (index 2)
    assert evicted(acts) == ["a", "b"]
    d = filled("lookahead")
    assert evicted(d.on_need("e", queued=["a", "x", "c", "b"], now=10)) == ["b"]


def test_lookahead_lru_among_unneeded() -> None:
    d = filled("lookahead")
    d.on_used("a", now=5)  # now b is least recently used
    assert evicted(d.on_need("d", queued=[], now=10)) == ["b", "c"]


def test_lru_and_fifo_orders() -> None:
    lru = filled("lru")
    lru.on_used("a", now=5)
    assert evicted(lru.on_need("d", queued=["b"], now=10)) == ["b", "c"]
    fifo = filled("fifo")
    fifo.on_used("a", now=5)
    assert evicted(fifo.on_need("e", queued=["b"], now=10)) == ["a"]


@pytest.mark.parametrize("policy", ["lookahead", "lru", "fifo"])
def test_running_model_never_evicted(policy: str) -> None:
    d = filled(policy)
    acts = d.on_need("d", queued=[], running="a", now=10)
    assert "a" not in evicted(acts)
    assert "a" in d.resident


def test_cache_full_names_model_size_and_free() -> None:
    d = filled("lookahead")
    with pytest.raises(CacheFullError, match=r"'e'.*30\.0 MB.*0\.0 MB free"):
        d.on_need("e", running=["a", "b", "c"])
    assert d.resident_mb() == 100  # a refused need changes nothing
    with pytest.raises(CacheFullError, match="never fit"):
        CacheDecider(100, sizes=SIZES).on_need("x", 101)


def test_prefetch_loads_next_models_within_free_memory() -> None:
    d = CacheDecider(100, sizes=SIZES)
    for a in d.on_need("a"):
        d.on_loaded(a.name)
    acts = d.prefetch(["b", "c", "d"], running="a", lookahead=3)
    assert acts == [Load("b", 30.0), Load("c", 30.0)]  # d (50) does not fit; stop there


def test_prefetch_evicts_only_unneeded() -> None:
    d = filled("lookahead")  # a b c, 100 MB full
    acts = d.prefetch(["c", "d", "a"], running="c", lookahead=3)
    assert acts == []  # only b may go, and 30 MB < 50 MB: evict nothing for nothing
    d2 = filled("lookahead")
    acts = d2.prefetch(["d"], running="c", lookahead=3)
    assert evicted(acts) == ["a", "b"] and acts[-1] == Load("d", 50.0)


def test_prefetch_respects_lookahead_window() -> None:
    d = CacheDecider(1000, sizes=SIZES)
    assert [a.name for a in d.prefetch(["a", "b", "c", "d"], lookahead=2)] == ["a", "b"]


def test_measured_size_wins_and_overflow_is_evicted() -> None:
    d = filled("lookahead", ("a", "b"))  # 70 MB
    for a in d.on_need("c", now=3):
        assert a == Load("c", 30.0)
    extra = d.on_loaded("c", size_mb=45.0, now=3)
    assert d.sizes["c"] == 45.0
    assert evicted(extra) == ["a"] and d.resident_mb() <= 100


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="policy"):
        CacheDecider(100, "mru")
    with pytest.raises(ValueError, match="capacity"):
        CacheDecider(0)


@pytest.mark.parametrize("policy", ["lru", "lookahead"])
def test_a_victim_that_frees_too_little_is_spared_once_a_later_one_makes_room(policy) -> None:
    # 100 MB: small s (10) oldest, then a (45) and b (45); d (45) needs 45 of the 0 free.
    # s comes first in eviction order but alone frees too little; once b (or a) is
    # evicted there is room without evicting s, so s stays resident.
    sizes = {"s": 10.0, "a": 45.0, "b": 45.0, "d": 45.0}
    d = CacheDecider(100, policy, sizes)
    for t, m in enumerate(("s", "a", "b")):
        for act in d.on_need(m, now=t):
            if isinstance(act, Load):
                d.on_loaded(act.name, now=t)
    acts = d.on_need("d", now=10)
    assert evicted(acts) == ["a"], acts
    assert "s" in d.resident
