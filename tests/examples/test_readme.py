"""The README's own code, copied verbatim into a new folder, passes as a user's project
would: the app (``proj.py``), its eager unit test and its Redis-backed test with the pytest
plugin, on emulated workers; plus one check that is not in the README, the same app on a
real torch worker on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"```python\n# (?P<file>[\w/]+\.py)\n(?P<body>.*?)```", re.S)

ON_A_CPU_WORKER = '''
import time

from proj import app


def test_caption_on_a_cpu_worker(compass_redis_url, compass_workers):
    app.conf.update(broker_url=compass_redis_url, result_backend=compass_redis_url)
    app.compass.follow_mode()  # test_eager.py ran before, eager: read Redis from here on
    w = compass_workers("proj", "cpu0@readme", "--compass-gpu", "cpu",
                        env={"REDIS_URL": compass_redis_url})
    deadline = time.time() + 30
    while not app.compass.store.snapshot(time.time(), 5.0).workers:
        assert time.time() < deadline and w.alive(), w.log()
        time.sleep(0.1)
    res = app.tasks["proj.caption"].delay([1.0] * 512)
    assert len(res.get(timeout=30)) == 4, w.log()
    assert app.compass.placement(res.id).worker == "cpu0@readme"
'''


def readme_files() -> dict[str, str]:
    """Every README code block that starts by naming its file, by file name."""
    return {m["file"]: m["body"] for m in BLOCK.finditer(README.read_text())}


def test_the_readme_names_its_project_files() -> None:
    assert {"proj.py", "conftest.py", "test_eager.py", "test_cluster.py"} <= set(readme_files())


@pytest.mark.redis
def test_the_readme_project_passes_its_own_tests(tmp_path: Path) -> None:
    for name, body in readme_files().items():
        (tmp_path / name).write_text(body)
    (tmp_path / "test_on_a_cpu_worker.py").write_text(ON_A_CPU_WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL")}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "3 passed" in run.stdout, run.stdout[-3000:]  # eager, cluster, cpu worker
