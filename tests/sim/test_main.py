"""``python -m compass_celery.sim``: writes the result JSON, rejects a bad workload by field."""

from __future__ import annotations

import json
from pathlib import Path

from compass_celery.sim.__main__ import main

DAGS = Path(__file__).resolve().parents[2] / "dags"


def test_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["--workload", str(DAGS / "vision-fanout.json"), "--policies", "compass,jsq",
               "--jobs", "40", "--workers", "8", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["workload"] == "vision-fanout" and set(data["policies"]) == {"compass", "jsq"}
    assert data["policies"]["compass"]["completed"] == 40


def test_bad_workload_names_field(tmp_path, capsys):
    bad = json.loads((DAGS / "vision-fanout.json").read_text())
    bad["arrivals"]["rate_per_s"] = "fast"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert main(["--workload", str(path)]) == 2
    assert "arrivals.rate_per_s: expected a number" in capsys.readouterr().err


def test_compare_pending(capsys):
    assert main(["--workload", str(DAGS / "caption-translate.json"), "--jobs", "30",
                 "--compare-pending"]) == 0
    assert set(json.loads(capsys.readouterr().out)["count_pending"]) == {"on", "off"}
