"""The prepared GPU script, run as CI runs it: unchanged, on the cpu device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers", reason="needs the real extra")
pytest.importorskip("silero_vad", reason="needs the real extra")

pytestmark = pytest.mark.redis


def test_device_check_runs_on_cpu_and_reports_every_part(tmp_path):
    out = tmp_path / "device.json"
    proc = subprocess.run(
        [sys.executable, "-m", "compass_celery.cli", "device-check", "--device", "cpu",
         "--jobs", "8", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    cache = result["cache"]
    assert [x["model"] for x in cache["loads"]] == ["silero-vad", "minilm-a", "minilm-b"]
    for load in cache["loads"]:  # measured on the device, as the catalogue says
        assert load["resident_mb"] == pytest.approx(load["catalogue_mb"], rel=0.01)
        assert load["ms"] > 0
    # the third embedder copy evicted the second (not the small VAD, not the queued one)
    assert cache["after_eviction"] == ["minilm-a", "minilm-c", "silero-vad"]
    assert cache["prefetched"] == ["minilm-b"] and "minilm-b" in cache["after_prefetch"]
    assert cache["counters"]["evictions"] >= 2 and cache["counters"]["hits"] >= 1
    assert "'minilm'" in cache["too_large"] and "can never fit" in cache["too_large"]

    fwd = result["forward"]
    assert set(fwd["embed_ms"]) == {"1", "8", "32"} and fwd["vad_ms"] > 0
    # a batch costs less per sentence than one sentence alone
    assert fwd["embed_ms_per_item"]["32"] < fwd["embed_ms_per_item"]["1"]

    bench = result["bench"]["policies"]
    assert set(bench) == {"celery-default", "compass"}
    for r in bench.values():
        assert r["completed"] == r["jobs"] == 8 and r["lost"] == 0
    # compass planned every node: its predictions are compared with what was measured
    terms = bench["compass"]["prediction"]["nodes"]
    assert terms["run"]["n"] > 0 and terms["finish"]["meas_median_ms"] > 0
    # a job's end as the plan saw it leaves out the submission and the result's delivery
    jobs, planned = bench["compass"]["prediction"]["jobs"], bench["compass"]["prediction"][
        "jobs_plan"]
    assert planned["n"] == jobs["n"] > 0
    assert 0 < planned["meas_median_ms"] < jobs["meas_median_ms"]
    assert "| embed, batch 32 |" in proc.stdout
