"""The hit-rate harness replays a workload deterministically; lookahead beats LRU and FIFO."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from compass_celery.cache import hitrate
from compass_celery.cache.hitrate import (
    DEFAULT_WORKLOAD,
    cpu_load_ms_per_mb,
    registrar,
    replay,
    task_streams,
)
from compass_celery.cache.registry import ModelRegistry
from compass_celery.cli import compass_command
from compass_celery.workload import Workload, load_workload, parse_workload

WORKLOAD = Path(DEFAULT_WORKLOAD)


@pytest.fixture
def workload() -> Workload:
    if not WORKLOAD.exists():
        pytest.skip(f"{WORKLOAD} not present")
    return load_workload(WORKLOAD)


def test_lookahead_loads_least(workload: Workload) -> None:
    streams = task_streams(workload, 4, "rr")
    assert streams == task_streams(workload, 4, "rr")  # seeded
    assert sum(map(len, streams)) > 400  # every job's tasks, from the workload's own stream
    res = {p: replay(streams, workload.models, 1600, p, window=6)
           for p in ("lookahead", "lru", "fifo")}
    assert res["lookahead"]["loads"] < min(res["lru"]["loads"], res["fifo"]["loads"])
    assert res["lookahead"]["hit_rate"] > res["lru"]["hit_rate"]


def test_streams_follow_each_dag_in_topological_order() -> None:
    wl = parse_workload({
        "models": {"det": 200, "cap": 900},
        # declared sink first: the stream must still run d before c
        "dags": {"pipe": {"nodes": {"c": {"model": "cap", "exec_ms": 1},
                                    "d": {"model": "det", "exec_ms": 1}},
                          "edges": [["d", "c"]]}},
        "cluster": {"workers": 2, "gpu_mem_mb": 1600},
        "arrivals": {"process": "poisson", "rate_per_s": 1, "jobs": 3},
    })
    assert task_streams(wl, 2, "rr") == [["det", "cap", "det", "cap"], ["det", "cap"]]


def hitrate_cli(*args: str) -> object:
    return CliRunner().invoke(compass_command, ["cache", "hitrate", *args])


def test_the_command_prints_the_table(workload: Workload) -> None:
    result = hitrate_cli("--workload", str(WORKLOAD))
    assert result.exit_code == 0, result.output
    assert "lookahead" in result.output and "lru" in result.output and "fifo" in result.output


def test_bad_workload_is_rejected_by_field(tmp_path: Path) -> None:
    doc = json.loads(WORKLOAD.read_text())
    doc["cluster"]["gpu_mem_mb"] = "big"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    result = hitrate_cli("--workload", str(bad))
    assert result.exit_code != 0 and "cluster.gpu_mem_mb" in result.output


def test_a_bad_models_spec_names_the_flag() -> None:
    result = hitrate_cli("--models", "no-colon")
    assert result.exit_code == 2 and "--models" in result.output


def test_load_timing_measures_whatever_a_registrar_registers() -> None:
    reg = ModelRegistry()
    reg.register("box", lambda: [0.0] * 10, 2.0)  # not a torch module: the declared size
    pytest.importorskip("torch")
    (mb, ms_per_mb), = cpu_load_ms_per_mb(reg, reps=1).values()
    assert mb == 2.0 and ms_per_mb >= 0.0
    assert registrar("compass_celery.cache.registry:ModelRegistry") is ModelRegistry
    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        registrar("workers.models")


def test_the_library_does_not_import_the_examples() -> None:
    tree = ast.parse(Path(hitrate.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("workers", "dags")]
