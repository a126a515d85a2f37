"""The README's and the docs' own code, copied verbatim into a new folder, passes as a user's
project would: the app (``proj.py``, in the README and in docs/getting-started.md), its eager
unit test and its Redis-backed test with the pytest plugin (docs/guides/testing.md), on
emulated workers; plus one check that is in neither, the same app on a real torch worker on
the CPU. A file shown on two pages must be the same on both. The API reference page names
every public name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Every page a user reads: the README and the documentation site's pages.
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
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


def page_files(pages: list[Path] = PAGES) -> dict[str, str]:
    """Every code block on the pages that starts by naming its file, by file name; a file
    shown on two pages must read the same on both."""
    found: dict[str, tuple[Path, str]] = {}
    for page in pages:
        for m in BLOCK.finditer(page.read_text()):
            seen = found.setdefault(m["file"], (page, m["body"]))
            assert seen[1] == m["body"], f"{m['file']} differs between {seen[0]} and {page}"
    return {name: body for name, (_, body) in found.items()}


def readme_files() -> dict[str, str]:
    """Every project file the README and the docs show."""
    return page_files()


def test_the_readme_names_its_project_files() -> None:
    assert "proj.py" in page_files([README])
    assert {"proj.py", "conftest.py", "test_eager.py", "test_cluster.py"} <= set(readme_files())


def test_the_api_page_names_every_public_name() -> None:
    """docs/reference/api.md renders, with mkdocstrings, each public name from where it is
    defined; each must be there (the lazy names of ``compass_celery`` and the jobs face)."""
    from importlib import import_module

    import compass_celery
    import compass_celery.jobs as jobs

    shown = set()
    for ref in re.findall(r"^::: ([\w.]+)$", (ROOT / "docs/reference/api.md").read_text(), re.M):
        module, _, name = ref.rpartition(".")
        shown.add(id(getattr(import_module(module), name)))
    public = {n: getattr(compass_celery, n) for n in compass_celery.__all__}
    public.update({n: getattr(jobs, n) for n in jobs.__all__})
    assert not [n for n, obj in public.items() if id(obj) not in shown]


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
