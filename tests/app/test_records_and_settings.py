"""Worker records, settings and task demands: bad input is named, never crashes."""

from __future__ import annotations

import contextlib
import json

import pytest
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from compass_celery import Compass
from compass_celery.needs import TaskDeclarationError, resolve_needs
from compass_celery.planner import PlanningError
from compass_celery.planner.types import WorkerView
from compass_celery.settings import SettingsError, resolve
from compass_celery.state.reader import SnapshotReader
from compass_celery.state.records import RecordError, decode_record, encode_record
from compass_celery.state.store import MemoryStateStore

GOOD = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600,
                  resident=frozenset({"a"}), heartbeat=100.0)


def test_record_round_trip():
    assert decode_record(encode_record(GOOD), field_name="w1") == GOOD


def test_a_learned_hop_travels_with_the_record_and_an_old_record_has_none():
    hopping = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600,
                         hop_ms=3.4)
    assert decode_record(encode_record(hopping), field_name="w1").hop_ms == 3.4
    assert "hop_ms" not in json.loads(encode_record(GOOD))  # unlearned: the old bytes


def test_a_load_under_way_travels_with_the_record_and_none_keeps_the_old_bytes():
    loading = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600,
                         loading={"big": (100.0, 102.5)})
    assert decode_record(encode_record(loading), field_name="w1").loading == {"big": (100.0, 102.5)}
    assert "loading" not in json.loads(encode_record(GOOD))


def test_the_tasks_running_travel_with_the_record_and_none_keeps_the_old_bytes():
    busy = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600,
                      running=((100.0, 102.5, 2500.0), (101.0, 101.0, 0.0)))
    back = decode_record(encode_record(busy), field_name="w1")
    assert back == busy and back.running == ((100.0, 102.5, 2500.0), (101.0, 101.0, 0.0))
    assert "running" not in json.loads(encode_record(GOOD))
    assert decode_record(encode_record(GOOD), field_name="w1").running == ()


def _with(**fields: object) -> str:
    return json.dumps({**json.loads(encode_record(GOOD)), **fields})


@pytest.mark.parametrize("raw, message", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({"name": "w1"}), "'queue'"),
    (json.dumps({"name": "w1", "queue": "q"}), "missing field 'gpu_total_mb'"),
    (json.dumps({**json.loads(encode_record(GOOD)), "gpu_free_mb": "lots"}), "gpu_free_mb"),
    (json.dumps({**json.loads(encode_record(GOOD)), "speed": 0}), "'speed' must be > 0"),
    (json.dumps({**json.loads(encode_record(GOOD)), "net_mb_per_s": 0.0}), "must be > 0"),
    (json.dumps({**json.loads(encode_record(GOOD)), "gpu_total_mb": True}), "finite number"),
    (json.dumps({**json.loads(encode_record(GOOD)), "heartbeat": float("nan")}), "finite"),
    (json.dumps({**json.loads(encode_record(GOOD)), "gpu_free_mb": float("inf")}), "finite"),
    (json.dumps({**json.loads(encode_record(GOOD)), "gpu_free_mb": -1}), "must be >= 0"),
    (json.dumps({**json.loads(encode_record(GOOD)), "resident": "a"}), "'resident'"),
    (json.dumps({**json.loads(encode_record(GOOD)), "name": "w2"}), "different worker"),
    (json.dumps({**json.loads(encode_record(GOOD)), "hop_ms": -2}), "'hop_ms' must be >= 0"),
    (json.dumps({**json.loads(encode_record(GOOD)), "hop_ms": "3"}), "'hop_ms' must be a"),
    (_with(loading=[["big", 1, 2]]), "'loading' must map model names"),
    (_with(loading={"big": [1]}), "model 'big' has \\[1\\]"),
    (_with(loading={"big": [1, "2"]}), "'loading' must map"),
    (_with(loading={"big": [-1, 2]}), "finite numbers >= 0"),
    (_with(loading={"big": [5, 2]}), "'big' ends \\(2.0\\) before it began \\(5.0\\)"),
    (_with(served={"m": [1, True]}), "'served' must map model names"),
    (_with(running={"t": [1, 2, 3]}), "'running' must be a list of \\[began, ends"),
    (_with(running=[[1, 2]]), "charge_ms\\] triples.*got \\[1, 2\\]"),
    (_with(running=[[1, 2, "3"]]), "'running' must be a list"),
    (_with(running=[[1, 2, -3]]), "finite numbers >= 0"),
    (_with(running=[[1, 2, float("nan")]]), "finite numbers >= 0"),
    (_with(running=[[1, 2, True]]), "'running' must be a list"),
    (_with(running=[[5, 2, 3]]), "a task ends \\(2\\) before it began \\(5\\)"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_garbled_records_are_named(raw, message):
    with pytest.raises(RecordError, match=message) as info:
        decode_record(raw, field_name="w1")
    assert "w1" in str(info.value)


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20))
def test_record_decoder_only_raises_record_error(value):
    with contextlib.suppress(RecordError):
        decode_record(json.dumps(value), field_name="w")


def test_snapshot_skips_garbage_and_dead_workers():
    store = MemoryStateStore()
    store.publish(GOOD)
    store.publish(WorkerView(name="old", queue="q", gpu_total_mb=1, gpu_free_mb=1,
                             heartbeat=1.0))
    store.records["junk"] = "{{"
    snap = store.snapshot(now=101.0, heartbeat_timeout_s=5.0)
    assert [w.name for w in snap.workers] == ["w1"]
    assert any("junk" in s for s in snap.skipped)
    assert any("old" in s and "dead" in s for s in snap.skipped)


def test_reader_applies_own_charges_to_cached_snapshot():
    store = MemoryStateStore()
    store.publish(GOOD)
    reader = SnapshotReader(store, ttl_s=60, heartbeat_timeout_s=1e12, clock=lambda: 100.0)
    assert reader.get().workers[0].backlog_ms == 0
    store.charge("w1", 50)
    reader.note_charge("w1", 50)
    assert reader.get().workers[0].backlog_ms == 50
    assert reader.reads == 1  # served from the local snapshot


def test_backlog_never_goes_negative():
    store = MemoryStateStore()
    store.publish(GOOD)
    store.charge("w1", 10)
    store.charge("w1", -30)
    assert store.snapshot(100.0, 5).workers[0].backlog_ms == 0


@pytest.mark.parametrize("conf, message", [
    ({"compass_heartbeat_timeout_s": -1}, "compass_heartbeat_timeout_s must be >="),
    ({"compass_policy": 3}, "compass_policy must be str"),
    ({"compass_models": {"m": -5}}, r"compass_models\['m'\]"),
    ({"compass_move_factor": float("nan")}, "finite"),
])
def test_bad_settings_are_named(conf, message):
    with pytest.raises(SettingsError, match=message):
        resolve(conf)


def test_unknown_policy_is_named():
    app = Celery("p")
    app.conf.compass_policy = "fastest"
    with pytest.raises(PlanningError, match="unknown policy 'fastest'"):
        _ = Compass(app).policy


def test_pickle_is_refused():
    app = Celery("pk")
    app.conf.accept_content = ["json", "pickle"]
    with pytest.raises(SettingsError, match="pickle"):
        _ = Compass(app).settings


class Declared:
    name = "t"
    compass_model = "m"
    compass_exec_ms = 20


def test_demand_resolution_order():
    learned = {"t|m": 55.0, "u|m": 70.0}
    assert resolve_needs("t", Declared, None, learned, 100).exec_source == "declared"
    call = resolve_needs("t", Declared, {"compass": {"exec_ms": 5}}, learned, 100)
    assert (call.exec_ms, call.exec_source) == (5, "call")

    class Undeclared:
        compass_model = "m"

    assert resolve_needs("u", Undeclared, None, learned, 100).exec_ms == 70.0
    assert resolve_needs("v", Undeclared, None, learned, 100).exec_source == "default"
    assert resolve_needs("plain", object(), None, learned, 100) is None


def test_a_batched_task_takes_the_curve_its_workers_learned_unless_one_is_declared():
    class Batched:
        compass_model = "m"
        compass_batch = {"max_size": 8}

    class Declared(Batched):
        compass_batch = {"max_size": 8, "per_item_ms": 3}
        compass_exec_ms = 30

    learned = {"b|m": 90.0, "b|m|per_item": 12.0, "d|m|per_item": 12.0}
    needs = resolve_needs("b", Batched, None, learned, 100)
    assert (needs.exec_ms, needs.batch.curve.base_ms, needs.batch.curve.per_item_ms) \
        == (90.0, 90.0, 12.0)
    assert needs.batch.key == "b|m"
    assert resolve_needs("b", Batched, None, {}, 100).batch.curve is None  # none learned
    declared = resolve_needs("d", Declared, None, learned, 100).batch.curve
    assert (declared.base_ms, declared.per_item_ms) == (30.0, 3.0)
    # a learned increment over a whole run is charged as a whole run, never more
    assert resolve_needs("b", Batched, None, {"b|m": 20.0, "b|m|per_item": 50.0},
                         100).batch.curve.per_item_ms == 20.0


@pytest.mark.parametrize("call, message", [
    ({"exec_ms": -1}, "exec_ms must be >= 0"),
    ({"exec_ms": float("inf")}, "finite"),
    ({"model": ""}, "model must be a non-empty string"),
    ({"modle": "x"}, "unknown compass call option"),
])
def test_bad_demands_are_named(call, message):
    with pytest.raises(TaskDeclarationError, match=message):
        resolve_needs("t", Declared, {"compass": call}, {}, 100)


class FlakyStore(MemoryStateStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.down = True

    def snapshot(self, now, heartbeat_timeout_s):
        self.calls += 1
        if self.down:
            from compass_celery.state.connection import StateUnavailable

            raise StateUnavailable("Redis at redis://x unavailable: refused")
        return super().snapshot(now, heartbeat_timeout_s)


def test_reader_fails_fast_while_state_is_down_then_recovers():
    from compass_celery.state.connection import StateUnavailable

    now = [100.0]
    store = FlakyStore()
    store.publish(GOOD)
    reader = SnapshotReader(store, ttl_s=0.0, heartbeat_timeout_s=1e12, clock=lambda: now[0])
    for _ in range(5):
        with pytest.raises(StateUnavailable, match="refused"):
            reader.get()
    assert store.calls == 1  # one real attempt; the other four failed fast
    store.down = False
    now[0] += reader.retry_after_s + 0.01
    assert [w.name for w in reader.get().workers] == ["w1"]


def test_every_input_error_shares_one_base_and_stays_a_value_error():
    from compass_celery import CompassInputError
    from compass_celery.dag_validation import DagValidationError
    from compass_celery.placement import PlacementError
    from compass_celery.settings import SettingsError
    from compass_celery.state.records import RecordError, decode_record
    from compass_celery.workload import WorkloadError

    for error in (WorkloadError, DagValidationError, SettingsError, PlacementError, RecordError):
        assert issubclass(error, CompassInputError) and issubclass(error, ValueError)
    with pytest.raises(CompassInputError, match="not valid JSON"):
        decode_record(b"{nope", field_name="w")


def test_a_bad_task_declaration_is_an_input_error_at_apply_async():
    """A malformed compass call option escapes ``apply_async`` as a CompassInputError
    (still a ValueError), naming the task, in eager mode and when routed."""
    from celery import Celery

    from compass_celery import CompassInputError
    from compass_celery.cache.errors import ModelTooLargeError, UnknownModelError

    for error in (TaskDeclarationError, UnknownModelError, ModelTooLargeError):
        assert issubclass(error, CompassInputError) and issubclass(error, ValueError)
    for eager in (True, False):
        app = Celery(f"decl{eager}", broker="memory://", set_as_current=False)
        app.conf.update(task_always_eager=eager, compass_models={"m": 100.0})
        Compass(app)

        @app.task(name="decl.t", shared=False, compass_model="m", compass_exec_ms=10)
        def t() -> int:
            return 1

        with pytest.raises(CompassInputError, match="'decl.t'.*exec_ms"):
            t.apply_async(compass={"exec_ms": -5})
