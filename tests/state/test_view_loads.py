"""The learned load times a view plans with: read once per profiles table, and each new
table (a fresh read, another snapshot) read again."""

from __future__ import annotations

import time

from compass_celery.needs import LOAD_PROFILE
from compass_celery.planner.types import WorkerView
from compass_celery.state import views
from compass_celery.state.store import Snapshot

SIZES = {"a": 500.0, "b": 900.0}


def _snapshot(profiles: dict[str, float]) -> Snapshot:
    w = WorkerView(name="w1", queue="q.w1", gpu_total_mb=2000.0, gpu_free_mb=1000.0)
    return Snapshot(workers=(w,), profiles=profiles, taken_at=time.time())


def test_each_profiles_table_gives_its_own_load_times() -> None:
    first = {f"{LOAD_PROFILE}|a": 700.0, "t|a": 12.0}
    view = views.cluster_view(_snapshot(first), SIZES)
    assert dict(view.load_ms) == {"a": 700.0}
    again = views.cluster_view(_snapshot(first), SIZES)  # the same table: the same times
    assert dict(again.load_ms) == {"a": 700.0}
    second = {f"{LOAD_PROFILE}|a": 650.0, f"{LOAD_PROFILE}|b": 90.0}  # a later read
    assert dict(views.cluster_view(_snapshot(second), SIZES).load_ms) == \
        {"a": 650.0, "b": 90.0}
    # an equal-looking table that is another object is read, not taken for the last one
    assert dict(views.cluster_view(_snapshot({}), SIZES).load_ms) == {}


def test_the_same_table_is_not_read_twice() -> None:
    table = {f"{LOAD_PROFILE}|b": 80.0}
    got = views.snapshot_loads(table)
    assert got == {"b": 80.0} and views.snapshot_loads(table) is got
    assert views.snapshot_loads(dict(table)) == got
