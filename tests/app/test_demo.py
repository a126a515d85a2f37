"""``compass-celery demo``'s burst, on its default four workers: some tasks find their
model resident and some must load it, so the table shows the load-against-wait trade-off."""

from __future__ import annotations

import re

import pytest

from compass_celery.demo import run_demo

pytestmark = pytest.mark.redis


def test_the_demo_burst_shows_loads_and_resident_models(compass_redis_url, tmp_path,
                                                         monkeypatch) -> None:
    import os
    import tempfile

    # the demo's workers log to the temp dir by default: here, the test's own
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = {k: os.environ.get(k) for k in ("COMPASS_BROKER_URL", "COMPASS_KEY_PREFIX")}
    lines: list[str] = []
    assert run_demo(compass_redis_url, 4, 16, echo=lines.append, side_by_side_jobs=0,
                    plot_path=None) == 0
    text = "\n".join(lines)
    table = text[text.index("task "):].splitlines()
    spans = [m.span() for m in re.finditer(r"-+", table[1])]  # the rule under the header
    column = [table[0][a:b].strip() for a, b in spans].index("load ms")
    a, b = spans[column]
    load_ms = [float(row[a:b]) for row in table[2:18]]
    assert any(ms > 0 for ms in load_ms) and any(ms == 0 for ms in load_ms), table
    assert "emulated GPU timings in workload ms" in text  # what the times mean, said once
    assert {k: os.environ.get(k) for k in before} == before  # the caller's environment back
