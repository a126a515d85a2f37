"""Readers decode a worker record again only when its bytes changed."""

from __future__ import annotations

from compass_celery.planner.types import WorkerView
from compass_celery.state.records import encode_record
from compass_celery.state.store import _assemble


def _raw(name: str, free: float) -> bytes:
    return encode_record(WorkerView(name=name, queue=f"compass.w.{name}", gpu_total_mb=1000,
                                    gpu_free_mb=free, heartbeat=1.0)).encode()


def test_unchanged_records_are_reused_changed_ones_decoded_again():
    cache: dict = {}
    ages = {"a": 0.1, "b": 0.1}
    first = _assemble({b"a": _raw("a", 500), b"b": _raw("b", 700)}, {}, {}, {}, 100.0, 5.0,
                      ages, "compass.w.", cache)
    view_a = cache["a"][1]
    second = _assemble({b"a": _raw("a", 500), b"b": _raw("b", 100)}, {}, {}, {}, 100.0, 5.0,
                       ages, "compass.w.", cache)
    assert cache["a"][1] is view_a  # same bytes: not decoded again
    assert [w.gpu_free_mb for w in first.workers] == [500, 700]
    assert [w.gpu_free_mb for w in second.workers] == [500, 100]  # changed: fresh values
    assert all(w.heartbeat == 100.0 - 0.1 for w in second.workers)  # Redis-clock age
    _assemble({b"b": _raw("b", 100)}, {}, {}, {}, 100.0, 5.0, ages, "compass.w.", cache)
    assert set(cache) == {"b"}  # a removed worker is forgotten


def test_a_cached_record_still_dies_when_its_beat_lapses():
    cache: dict = {}
    raw = {b"a": _raw("a", 500)}
    assert len(_assemble(raw, {}, {}, {}, 100.0, 5.0, {"a": 1.0}, "compass.w.",
                         cache).workers) == 1
    snap = _assemble(raw, {}, {}, {}, 100.0, 5.0, {"a": 6.0}, "compass.w.", cache)
    assert snap.workers == () and "dead" in snap.skipped[0]
