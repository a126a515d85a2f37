"""The placement view cache: a carried-over view plans exactly as a freshly built one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from compass_celery.planner.cost import build_worker_arrays, worker_arrays
from compass_celery.planner.types import ClusterView, WorkerView
from compass_celery.state.views import ViewCache

SIZES = {"a": 500.0, "b": 900.0, "c": 300.0}


def workers(n: int = 40) -> tuple[WorkerView, ...]:
    """Workers in a shuffled order (the view sorts them by name)."""
    out = [WorkerView(name=f"w{i:03d}", queue=f"q.w{i:03d}", gpu_total_mb=2000.0,
                      gpu_free_mb=1000.0 - i, resident=frozenset("ab"[: i % 3]),
                      backlog_ms=float(i), speed=1.0 + (i % 4) / 10)
           for i in range(n)]
    return tuple(out[7:] + out[:7])


def same_columns(view: ClusterView) -> bool:
    got, want = worker_arrays(view), build_worker_arrays(ClusterView.of(view.workers, SIZES))
    return got.names == want.names and all(
        np.array_equal(getattr(got, f), getattr(want, f))
        for f in ("backlog_ms", "pending_ms", "gpu_free_mb", "gpu_total_mb", "speed",
                  "resident", "host_resident", "ms_per_mb", "ms_per_kb", "host_ms_per_mb")
    ) and got.host_models == want.host_models and view.workers == tuple(
        sorted(view.workers, key=lambda w: w.name))


def test_backlog_charges_are_carried_over_not_rebuilt() -> None:
    cache, ws = ViewCache(), workers()
    first = cache.get(ws, SIZES, 1.0)
    assert cache.built == 1 and same_columns(first)
    assert cache.get(ws, SIZES, 1.0) is first  # same snapshot, same view
    charged = list(ws)
    for i in (0, 5, 39):
        charged[i] = replace(ws[i], backlog_ms=ws[i].backlog_ms + 120.0, pending_ms=30.0)
    view = cache.get(tuple(charged), SIZES, 1.0)
    assert cache.built == 1 and cache.carried == 2
    assert same_columns(view)
    assert worker_arrays(view).backlog_ms[worker_arrays(view).index[ws[5].name]] == \
        ws[5].backlog_ms + 120.0
    assert worker_arrays(first).backlog_ms[worker_arrays(first).index[ws[5].name]] == \
        ws[5].backlog_ms  # the earlier view is left as it was


def test_changed_records_rewrite_their_rows_only() -> None:
    cache, ws = ViewCache(), workers()
    first = cache.get(ws, SIZES, 1.0)
    loaded = list(ws)
    loaded[3] = replace(ws[3], resident=frozenset({"c"}), host_resident=frozenset({"a"}),
                        gpu_free_mb=10.0, load_mb_per_s=3000.0)
    loaded[9] = replace(ws[9], gpu_total_mb=4000.0, net_mb_per_s=50.0)
    view = cache.get(tuple(loaded), SIZES, 2.0)
    assert cache.built == 1 and cache.carried == 1
    assert same_columns(view) and view.now == 2.0
    assert set(view.workers) == set(loaded)
    assert same_columns(first)  # the earlier view is left as it was


def test_a_worker_coming_or_going_or_new_models_build_afresh() -> None:
    cache, ws = ViewCache(), workers()
    cache.get(ws, SIZES, 1.0)
    assert same_columns(cache.get(ws[:-1], SIZES, 1.0)) and cache.built == 2  # one left
    swapped = (*ws[:-2], replace(ws[-1], name="new", queue="q.new"))
    assert same_columns(cache.get(swapped, SIZES, 1.0)) and cache.built == 3
    cache.get(swapped, {**SIZES, "d": 1.0}, 1.0)
    assert cache.built == 4
