"""A worker record carries the demand the worker served: round trip, old records, garbage."""

from __future__ import annotations

import json

import pytest

from compass_celery.planner.types import ModelDemand, WorkerView
from compass_celery.state.records import RecordError, decode_record, encode_record

SERVED = {"llm": ModelDemand(640.0, 0.53), "vit": ModelDemand(12.0, 0.002)}
VIEW = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600,
                  resident=frozenset({"llm"}), heartbeat=100.0, served=SERVED)


def test_served_round_trips() -> None:
    back = decode_record(encode_record(VIEW), field_name="w1")
    assert back == VIEW and back.served == SERVED
    assert json.loads(encode_record(VIEW))["served"] == {"llm": [640.0, 0.53],
                                                         "vit": [12.0, 0.002]}


def test_nothing_served_adds_no_bytes_and_old_records_decode() -> None:
    plain = WorkerView(name="w1", queue="q1", gpu_total_mb=1600, gpu_free_mb=600)
    raw = encode_record(plain)
    assert "served" not in raw
    assert decode_record(raw, field_name="w1").served == {}


def test_views_with_served_stay_hashable() -> None:
    assert len({VIEW, decode_record(encode_record(VIEW), field_name="w1")}) == 1


@pytest.mark.parametrize("served", [
    "lots", [["llm", 1, 2]], {"llm": 3}, {"llm": [1.0]}, {"llm": [1.0, 2.0, 3.0]},
    {"llm": [1.0, "x"]}, {"llm": [-1.0, 0.5]}, {"llm": [1.0, True]},
    {"llm": [1.0, None]}, {"llm": {"ms_per_s": 1.0, "per_s": 2.0}},
])
def test_garbled_served_is_refused_naming_the_worker(served: object) -> None:
    body = {**json.loads(encode_record(VIEW)), "served": served}
    with pytest.raises(RecordError, match="'served'") as info:
        decode_record(json.dumps(body), field_name="w1")
    assert "'w1'" in str(info.value)


def test_non_finite_served_is_refused() -> None:
    raw = encode_record(VIEW).replace("0.53", "Infinity")
    with pytest.raises(RecordError, match="w1.*served"):
        decode_record(raw, field_name="w1")
