"""The hit-rate harness replays a workload deterministically; lookahead beats LRU and FIFO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass_celery.cache.hitrate import DEFAULT_WORKLOAD, main, replay, task_streams

WORKLOAD = Path(DEFAULT_WORKLOAD)


@pytest.fixture
def workload() -> dict:
    if not WORKLOAD.exists():
        pytest.skip(f"{WORKLOAD} not present")
    return json.loads(WORKLOAD.read_text())


def test_lookahead_loads_least(workload: dict) -> None:
    sizes = {m: v["size_mb"] for m, v in workload["models"].items()}
    streams = task_streams(workload, 4, "rr")
    assert streams == task_streams(workload, 4, "rr")  # seeded
    res = {p: replay(streams, sizes, 1600, p, window=6) for p in ("lookahead", "lru", "fifo")}
    assert res["lookahead"]["loads"] < min(res["lru"]["loads"], res["fifo"]["loads"])
    assert res["lookahead"]["hit_rate"] > res["lru"]["hit_rate"]


def test_main_prints_table(workload: dict, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--workload", str(WORKLOAD), "--no-torch"])
    out = capsys.readouterr().out
    assert "lookahead" in out and "lru" in out and "fifo" in out
