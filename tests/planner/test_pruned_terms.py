"""The planner's pruned terms give what the full ones give, float for float.

``EvictionPricer.choice_price`` prices only the workers a choice can fall on, and
``cost.Hidden`` works out the hidden part of a load only where it is read: a choice
made with either must be the choice made with every worker's term (the simulator's
results are compared before/after for a seed, so a pruning that changed one decision
would be wrong, not slower).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from compass_celery.planner.choose import choose
from compass_celery.planner.cost import Flight, Hidden, hidden_load_ms, load_terms, worker_arrays
from compass_celery.planner.evict import EvictionPricer
from compass_celery.planner.types import ClusterView, ModelDemand, WorkerView

MODELS = {f"m{j}": float(s) for j, s in enumerate((800, 1000, 1600, 2800, 3500, 4200,
                                                      5700, 1200, 3000, 4000))}


def _cluster(rng: random.Random, n: int) -> ClusterView:
    workers = []
    for i in range(n):
        gpu = rng.choice((8000.0, 14336.0))
        held: set[str] = set()
        used = 0.0
        for m in rng.sample(sorted(MODELS), rng.randint(0, 4)):
            if used + MODELS[m] <= gpu:
                held.add(m)
                used += MODELS[m]
        workers.append(WorkerView(f"w{i:03d}", f"q{i}", gpu, gpu - used, frozenset(held),
                                  backlog_ms=rng.choice((0.0, rng.uniform(0, 3000))),
                                  load_mb_per_s=rng.choice((6000.0, 12000.0))))
    demand = {m: ModelDemand(rng.uniform(0, 3000), rng.uniform(0, 8),
                             rng.choice((0.0, 1.0))) for m in MODELS}
    return ClusterView(tuple(workers), MODELS, 0.0, demand)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("batch", [False, True])
def test_choice_price_chooses_as_the_full_price(seed: int, batch: bool) -> None:
    rng = random.Random(seed)
    cluster = _cluster(rng, rng.choice((5, 40, 300)))
    arr = worker_arrays(cluster)
    n = len(arr)
    for _ in range(10):
        model = rng.choice(sorted(MODELS))
        size = MODELS[model]
        pricer = EvictionPricer(arr, cluster.demand, MODELS, batch=batch)
        load = arr.load_columns(model, size)[0].copy()
        load = np.where(size <= arr.gpu_free_mb, load, load * 2)
        # finishes with ties (rounded) and some equal to a holder's
        finish = np.round(arr.backlog_ms + load + rng.uniform(10, 500), -1 if seed % 2 else 0)
        mask = arr.fits(size) if seed % 3 else None
        keep = tuple(rng.sample(range(n), min(2, n)))
        full = pricer.price(model, size, arr.gpu_free_mb, load)
        part = pricer.choice_price(model, size, arr.gpu_free_mb, load, finish, mask, keep)
        priced = part != 0
        assert np.array_equal(part[priced], full[priced])  # bit for bit where priced
        assert all(part[k] == full[k] for k in keep)
        best = choose(finish + full, arr.backlog_ms, mask)
        assert choose(finish + part, arr.backlog_ms, mask) == best
        assert part[best] == full[best]
        pricer.mark(best, model)  # the plan's later tasks see its load
    assert n == len(cluster.workers)


def test_choice_price_prunes_workers_that_cannot_win() -> None:
    """An idle worker that must evict to load the model, finishing after a holder,
    is not priced; the holder's own worker (no eviction) never is."""
    big = WorkerView("a", "a", 14336.0, 14336.0 - 5700.0, frozenset({"m6"}))
    far = WorkerView("b", "b", 14336.0, 14336.0 - 14000.0,
                     frozenset({"m0", "m3", "m4", "m5", "m8"}))
    cluster = ClusterView((big, far), MODELS, 0.0,
                          {m: ModelDemand(1000.0, 4.0) for m in MODELS})
    arr = worker_arrays(cluster)
    pricer = EvictionPricer(arr, cluster.demand, MODELS)
    load = np.array([0.0, 900.0])
    finish = np.array([100.0, 1000.0])
    full = pricer.price("m6", 5700.0, arr.gpu_free_mb, load)
    assert full[1] > 0
    part = pricer.choice_price("m6", 5700.0, arr.gpu_free_mb, load, finish, None)
    assert part[1] == 0 and part[0] == 0
    kept = pricer.choice_price("m6", 5700.0, arr.gpu_free_mb, load, finish, None, (1,))
    assert kept[1] == full[1]


def test_choice_price_prices_all_when_no_bound() -> None:
    """No worker free of eviction, or a NaN/infinite bound: every evicting row priced."""
    w = WorkerView("a", "a", 14336.0, 100.0, frozenset({"m0", "m3", "m4", "m5", "m8"}))
    cluster = ClusterView((w, w.__class__("b", "b", 14336.0, 100.0, w.resident)), MODELS,
                          0.0, {m: ModelDemand(1000.0, 4.0) for m in MODELS})
    arr = worker_arrays(cluster)
    pricer = EvictionPricer(arr, cluster.demand, MODELS)
    load = np.array([900.0, 900.0])
    full = pricer.price("m6", 5700.0, arr.gpu_free_mb, load)
    for finish in (np.array([1.0, 5000.0]), np.array([math.nan, 1.0])):
        part = pricer.choice_price("m6", 5700.0, arr.gpu_free_mb, load, finish, None)
        assert np.array_equal(part, full)


@pytest.mark.parametrize("seed", range(30))
def test_hidden_is_hidden_load_ms_float_for_float(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 50
    fit = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(0, 900, n))
    columns = (fit, fit * 2)
    free = rng.choice([0.0, 500.0, 5000.0], n)
    ready = rng.uniform(0, 400, n) if seed % 2 else float(rng.uniform(0, 400))
    start = np.maximum(rng.uniform(0, 800, n), ready)
    loader = rng.uniform(0, 900, n) if seed % 3 else 0.0
    if seed % 5 == 0:  # NaN and exact ties, as numpy's maximum/minimum order them
        start[:3] = math.nan
        start[3:6] = ready if isinstance(ready, float) else ready[3:6]
    at = np.sort(rng.choice(n, 5, replace=False)) if seed % 4 else np.zeros(0, dtype=np.intp)
    flight = Flight(at, rng.uniform(0, 900, len(at)))
    load, hidden = load_terms(columns, 1000.0, free, ready, start, loader, flight)
    fits = free >= 1000.0
    expect = hidden_load_ms(ready, start, np.where(fits, fit, fit * 2), fits, loader)
    expect[at] = 0.0
    got = np.array([hidden[i] for i in range(n)])
    assert np.array_equal(got, expect, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(expect))
    assert np.array_equal(hidden.array(), expect, equal_nan=True)


def test_hidden_keeps_what_it_read_and_what_was_written() -> None:
    """A forming batch rewrites ``start`` after reading the hidden part there; a write
    acts as on an array; the plan's loader column is copied."""
    start, load = np.array([500.0, 500.0]), np.array([300.0, 300.0])
    loader = np.zeros(2)
    hidden = Hidden(0.0, start, load, np.array([True, True]), loader)
    assert hidden[0] == 300.0
    start[0] = 0.0
    loader[1] = 400.0
    assert hidden[0] == 300.0  # read before the rewrite: kept
    assert hidden[1] == 300.0  # the loader as it was (it would hide 100 ms from 400)
    hidden[1] = 0.0
    assert hidden[1] == 0.0
    assert hidden.array().tolist() == [300.0, 0.0]


@pytest.mark.parametrize("seed", range(20))
def test_rank_of_terms_is_the_pricers_rank(seed: int) -> None:
    """eviction_rank's rank worked out from the terms in Python floats is the rank a
    pricer of the snapshot gives (``_rank``), number for number."""
    from compass_celery.planner.evict import _rank, _rank_of, _snapshot_terms

    rng = random.Random(seed)
    cluster = _cluster(rng, rng.choice((3, 20, 200)))
    arr = worker_arrays(cluster)
    terms = _snapshot_terms(arr, cluster.demand, MODELS)
    got = _rank_of(terms, arr.models)
    want = _rank(EvictionPricer(arr, cluster.demand, MODELS))
    assert got == want
    assert {type(x) for v in got.values() for x in v} == {float}


@pytest.mark.parametrize("seed", range(40))
def test_busy_price_chooses_as_the_full_busy_price(seed: int) -> None:
    """``EvictionPricer.busy_price`` (the busy-load price worked out only where the
    choice can fall and at ``keep``) gives the choice, the chosen worker's and the kept
    workers' scores of the full ``busy_load_price``, bit for bit, and prices only rows
    at or below the bound (past capacity: most workers busy and cold)."""
    from compass_celery.planner.evict import busy_load_price

    rng = random.Random(seed)
    cluster = _cluster(rng, rng.choice((5, 40, 300)))
    arr = worker_arrays(cluster)
    n = len(arr)
    nprng = np.random.default_rng(seed)
    for _ in range(10):
        model = rng.choice(sorted(MODELS))
        size = MODELS[model]
        pricer = EvictionPricer(arr, cluster.demand, MODELS)
        avail, start, load, hidden = _drawn_terms(arr, nprng, model, size)
        finish = np.round(start + load + rng.uniform(10, 500), -1 if seed % 2 else 0)
        mask = arr.fits(size) if seed % 3 else None
        keep = tuple(rng.sample(range(n), min(2, n)))
        full = busy_load_price(load, hidden.array(), avail)
        part = pricer.busy_price(load, hidden, avail, finish, mask, keep)
        priced = part != 0
        assert np.array_equal(part[priced], full[priced])
        assert all(part[k] == full[k] for k in keep)
        best = choose(finish + full, avail, mask)
        assert choose(finish + part, avail, mask) == best
        assert part[best] == full[best]
        cheap = finish + part
        evict = pricer.choice_price(model, size, arr.gpu_free_mb, load, cheap, mask, keep)
        whole = full + pricer.choice_price(model, size, arr.gpu_free_mb, load, finish + full,
                                           mask, keep)
        assert choose(cheap + evict, avail, mask) == choose(finish + whole, avail, mask)


def test_busy_price_prices_every_row_when_unsound() -> None:
    """A NaN or infinite finish, a NaN loader or no worker free of loads: no pruning."""
    w = WorkerView("a", "a", 14336.0, 14336.0 - 5700.0, frozenset({"m6"}))
    cluster = ClusterView((w, WorkerView("b", "b", 14336.0, 14336.0, frozenset())), MODELS,
                          0.0, {m: ModelDemand(1000.0, 4.0) for m in MODELS})
    pricer = EvictionPricer(worker_arrays(cluster), cluster.demand, MODELS)
    avail = np.array([100.0, 900.0])
    load = np.array([0.0, 500.0])
    start = np.array([100.0, 900.0])
    cases = [(np.array([150.0, math.inf]), 0.0), (np.array([math.nan, 1900.0]), 0.0),
             (np.array([150.0, 1900.0]), np.array([0.0, math.nan]))]
    for finish, loader in cases:
        hidden = Hidden(0.0, start, load, np.array([True, True]), loader)
        got = pricer.busy_price(load, hidden, avail, finish, None)
        assert np.array_equal(got, busy_load_price_full(load, hidden, avail), equal_nan=True)
    hidden = Hidden(0.0, start, load, np.array([True, True]), 0.0)
    pruned = pricer.busy_price(load, hidden, avail, np.array([150.0, 1900.0]), None)
    assert pruned.tolist() == [0.0, 0.0]  # b finishes past a's 150 ms: not priced
    all_cold = np.array([500.0, 500.0])
    got = pricer.busy_price(all_cold, None, avail, np.array([1.0, 2.0]), None)
    assert np.array_equal(got, busy_load_price_full(all_cold, None, avail))


def busy_load_price_full(load: np.ndarray, hidden: object, avail: np.ndarray) -> np.ndarray:
    """The unpruned price, every row."""
    from compass_celery.planner.evict import busy_load_price

    return busy_load_price(load, hidden.array() if isinstance(hidden, Hidden) else hidden,
                           avail)


@pytest.mark.parametrize("seed", range(20))
def test_loader_rewrite_is_the_full_pass(seed: int) -> None:
    """``load_terms`` rewrites the load only where the loader is free after the start,
    float for float as the pass over every worker (NaN, infinities, negative starts)."""
    rng = np.random.default_rng(seed)
    n = 60
    fit = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(0, 900, n))
    free = rng.choice([0.0, 5000.0], n)
    start = rng.uniform(-50, 800, n)
    loader = np.where(rng.random(n) < 0.3, rng.uniform(0, 900, n), 0.0)
    if seed % 3 == 0:
        start[:2], loader[2:4], start[5] = math.nan, (math.inf, math.nan), -math.inf
    load, _ = load_terms((fit, fit * 2), 1000.0, free, 0.0, start, loader)
    asked = np.where(free >= 1000.0, fit, fit * 2)
    with np.errstate(invalid="ignore"):
        behind = loader - start
        expect = np.where((asked > 0.0) & (behind > 0.0), asked + behind, asked)
    assert np.array_equal(load, expect, equal_nan=True)


def _loading_cluster(rng: random.Random, n: int) -> ClusterView:
    """:func:`_cluster`, with some workers loading a model not resident there."""
    base = _cluster(rng, n)
    workers = []
    for w in base.workers:
        cold = sorted(set(MODELS) - w.resident)
        if cold and rng.random() < 0.3:
            m = rng.choice(cold)
            w = WorkerView(w.name, w.queue, w.gpu_total_mb, w.gpu_free_mb, w.resident,
                           backlog_ms=w.backlog_ms, load_mb_per_s=w.load_mb_per_s,
                           loading={m: (-100.0, rng.uniform(0.0, 900.0))})
        workers.append(w)
    return ClusterView(tuple(workers), MODELS, 0.0, base.demand)


def _drawn_terms(arr: Any, nprng: np.random.Generator, model: str, size: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """Random workers' free times, starts and a model's load terms on them (a tenth of
    them loading something already), for the price tests."""
    n = len(arr)
    avail = np.where(nprng.random(n) < 0.2, 0.0, nprng.uniform(0, 3000, n))
    ready = nprng.uniform(0, 50, n)
    start = np.maximum(avail, ready)
    loader = np.where(nprng.random(n) < 0.1, nprng.uniform(0, 4000, n), 0.0)
    load, hidden = load_terms(arr.load_columns(model, size), size, arr.gpu_free_mb,
                              ready, start, loader)
    return avail, start, load, hidden


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("few", [0, 24, 10**6])
def test_prices_are_the_two_prices_element_for_element(seed: int, few: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``EvictionPricer.prices`` gives ``busy_price`` and ``choice_price`` (on the finish
    plus that busy price) as the two calls do, every element equal: whatever hidden part
    (a ``Hidden``, an array, None), mask, kept rows, loads under way, marks, and finishes
    (ties, NaN, infinities, no worker free of loads: the two methods' own passes); its
    rows in numpy (``few`` 0), in Python floats (every row) or either (the default)."""
    from compass_celery.planner import evict

    monkeypatch.setattr(evict, "_FEW_ROWS", few)
    rng = random.Random(seed)
    cluster = _loading_cluster(rng, rng.choice((3, 40, 300)))
    arr = worker_arrays(cluster)
    n = len(arr)
    nprng = np.random.default_rng(seed)
    pricer = EvictionPricer(arr, cluster.demand, MODELS, batch=seed % 2 == 0)
    for k in range(12):
        model = rng.choice(sorted(MODELS))
        size = MODELS[model]
        avail, start, load, hidden = _drawn_terms(arr, nprng, model, size)
        if k % 4 == 1:
            load = np.where(nprng.random(n) < 0.05, 0.0, load + 1.0)  # few free of loads
        hid = (hidden, hidden.array(), None)[k % 3]
        finish = np.round(start + load + rng.uniform(10, 500), -1 if seed % 2 else 0)
        if k == 5:
            finish[rng.randrange(n)] = rng.choice((math.nan, math.inf))
        if k == 7:
            load = load + 1.0  # every worker loads: no bound
        mask = arr.fits(size) if k % 3 else None
        keep = tuple(rng.sample(range(n), min(rng.randint(0, 3), n)))
        busy = pricer.busy_price(load, hid, avail, finish, mask, keep)
        price = pricer.choice_price(model, size, arr.gpu_free_mb, load, finish + busy,
                                    mask, keep)
        got_busy, got_price = pricer.prices(model, size, arr.gpu_free_mb, load, hid, avail,
                                            finish, mask, keep)
        assert np.array_equal(got_busy, busy, equal_nan=True)
        assert np.array_equal(got_price, price, equal_nan=True)
        pricer.mark(choose(finish + busy + price, avail, mask), model)


def test_terms_are_kept_by_their_numbers() -> None:
    """Two demands that give the same targets, chances and urgent flags (the rates decay
    at every clock; a model asked for often has chance 1.0) give the very same terms, so
    what is memoised by them (victim orders, the cache rank) is kept; a target that
    changes gives new terms, as a fresh build would."""
    from compass_celery.planner import evict
    from compass_celery.planner.evict import _build_terms, _snapshot_terms

    rng = random.Random(3)
    cluster = _cluster(rng, 40)
    arr = worker_arrays(cluster)
    first = {m: ModelDemand(900.0, 50.0, 0.0) for m in MODELS}
    later = {m: ModelDemand(850.0, 49.0, 0.0) for m in MODELS}  # decayed a little
    a = _snapshot_terms(arr, first, MODELS)
    b = _snapshot_terms(arr, later, MODELS)
    assert a is b
    assert EvictionPricer(arr, later, MODELS)._victims is \
        EvictionPricer(arr, first, MODELS)._victims
    more = {m: ModelDemand(1700.0, 50.0, 0.0) for m in MODELS}  # targets 3, not 2
    c = _snapshot_terms(arr, more, MODELS)
    assert c is not a and c[1].tolist() == [3] * len(MODELS) and a[1].tolist() == [2] * 10
    evict._BY_VALUE.clear()  # built afresh: the same numbers
    fresh = _build_terms(arr, first, MODELS)
    assert fresh is not a
    assert all(np.array_equal(x, y) for x, y in zip(fresh, a, strict=True))
