"""Flower shows each task's placement: REST API, task page, task list and worker page.

A private Redis, two compass workers with task events on (``-E``), and a real Flower
process; the pages are read by headless Chromium, so what is asserted is what a user's
browser renders. The placement reaches Flower through Celery's own ``task-received``
event (the message's ``kwargsrepr``), with no lookup of Flower's own.

Set ``COMPASS_FLOWER_SCREENSHOTS=DIR`` to also save the task and worker pages as PNGs
(``docs/flower_screenshots.py`` does this for the docs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.local import free_port, wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import start

pytestmark = pytest.mark.redis

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MODULE = "tests.support.jobapp"
PLACEMENT_FIELDS = ("compass: worker=", "policy=", "est_finish=", "moved_from=", "reason=")


class Flower:
    """A ``celery flower`` process on a free local port; its log for failure messages."""

    def __init__(self, broker_url: str, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = str(log_dir / "flower.log")  # the test's tmp_path: removed on a pass
        env = {**os.environ, "COMPASS_BROKER_URL": broker_url,
               "FLOWER_UNAUTHENTICATED_API": "true"}  # the REST API, for this test only
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", MODULE, "flower",
                 f"--port={self.port}", "--address=127.0.0.1",
                 "--tasks_columns=name,uuid,state,args,worker,routing_key,runtime,kwargs"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError:
            return 0, ""

    def api(self, path: str) -> Any:
        status, body = self.get(path)
        return json.loads(body) if status == 200 else None

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def chromium(url: str, *flags: str, timeout: float = 90.0) -> str:
    """Load ``url`` in headless Chromium, let its scripts and AJAX run, return stdout."""
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp(prefix="compass-chromium-")
    try:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
             "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
             "--force-prefers-reduced-motion",  # no fade-in: screenshots at full opacity
             "--virtual-time-budget=5000", *flags, url],
            capture_output=True, text=True, timeout=timeout, check=False)
        return out.stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def dump_dom(url: str) -> str:
    return chromium(url, "--dump-dom")


def screenshot(url: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    chromium(url, f"--screenshot={path}", "--window-size=1400,900")
    assert path.is_file() and path.stat().st_size > 10_000, f"no screenshot of {url}"


@pytest.fixture
def flower(compass_redis_url: str, tmp_path: Path) -> Iterator[Flower]:
    if CHROMIUM is None:
        pytest.skip("chromium not installed (Debian: apt-get install chromium)")
    proc = Flower(compass_redis_url, tmp_path)
    try:
        wait_until(lambda: proc.get("/healthcheck")[0] == 200 or proc.proc.poll() is not None,
                   60, "flower to answer")
        assert proc.proc.poll() is None, proc.log()
        yield proc
    finally:
        proc.stop()


def wait_for_task(flower: Flower, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The task as Flower's API reports it, once its task-received event has arrived."""
    def seen() -> dict[str, Any] | None:
        info = flower.api(f"/api/task/info/{task_id}")
        return info if info and "compass:" in str(info.get("kwargs")) else None

    return wait_until(seen, timeout, f"flower to report task {task_id}", interval=0.2)


def test_flower_shows_placement_on_api_task_pages_and_worker_page(
        compass_redis_url: str, compass_workers: Any, flower: Flower) -> None:
    shots = os.environ.get("COMPASS_FLOWER_SCREENSHOTS")
    tag = "example" if shots else f"flower{os.getpid()}"  # plain names in the docs' pictures
    names = [f"gpu0@{tag}", f"gpu1@{tag}"]
    app, ws = start(compass_redis_url, compass_workers, names, timeout_s=3.0,
                    extra_args=["-E"])
    app.conf.task_send_sent_event = True  # opt-in: Flower's routing-key column (docs)
    context = lambda: f"{worker_logs(ws)}\n--- flower ---\n{flower.log()}"  # noqa: E731

    # Flower's event receiver subscribes a moment after it answers HTTP, and events sent
    # before that are gone: send a routed task until Flower reports one.
    probe = None
    deadline = time.monotonic() + 60
    while probe is None:
        result = app.tasks["j.src"].apply_async(kwargs={"x": 7})
        try:
            probe = wait_for_task(flower, result.id, timeout=5)
        except TimeoutError:
            assert time.monotonic() < deadline, context()
    assert result.get(timeout=20) == 7
    decision = app.compass.placement(result.id)
    assert decision is not None and decision.worker in names
    kwargs = probe["kwargs"]
    assert kwargs.startswith("{'x': 7} | compass: "), kwargs
    assert probe["args"].startswith(f"[{decision.worker} · small · "), probe["args"]
    for field in (*PLACEMENT_FIELDS, f"worker={decision.worker}",
                  f"policy={decision.policy}", f"est_finish={decision.est_finish_ms:.0f}ms"):
        assert field in kwargs, kwargs

    # a job: its source is sent by this producer, its successor by a worker
    dag = Dag(app, "flower")
    a = dag.node("a", app.tasks["j.src"].s(4))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async()
    assert job.get(timeout=30) == {"b": 5}, context()
    placed = job.placement()
    for node in ("a", "b"):
        info = wait_for_task(flower, placed[node]["task_id"])
        assert f"compass: worker={placed[node]['worker']} " in info["kwargs"], info
        assert all(f in info["kwargs"] for f in PLACEMENT_FIELDS), info
    listed = flower.api("/api/tasks")
    assert listed is not None and {result.id, placed["b"]["task_id"]} <= set(listed)
    assert "compass: worker=" in listed[placed["b"]["task_id"]]["kwargs"]

    # the task page, as a browser renders it
    page = dump_dom(f"{flower.url}/task/{result.id}")
    assert result.id in page, page[-2000:]
    for field in (*PLACEMENT_FIELDS, f"worker={decision.worker}",
                  f"est_finish={decision.est_finish_ms:.0f}ms"):
        assert field in page, page[-3000:]

    # the task list fills its table by AJAX; the kwargs column carries the placement
    listing = dump_dom(f"{flower.url}/tasks")
    assert result.id in listing and "compass: worker=" in listing, listing[-3000:]
    assert f"[{decision.worker} · small · " in listing, listing[-3000:]  # args: in front

    # the worker page: the compass section of `inspect stats` (Other tab)
    worker = decision.worker
    wpage = dump_dom(f"{flower.url}/worker/{worker}#tab-other")
    assert "compass" in wpage, wpage[-3000:]
    for field in ("compass_resident_models", "small", "compass_gpu_free_mb",
                  "compass_gpu_total_mb", "compass_backlog_ms", app.compass.queue_for(worker)):
        assert field in wpage, (field, wpage[-3000:])

    if shots:
        screenshot(f"{flower.url}/tasks", Path(shots) / "flower-tasks.png")
        screenshot(f"{flower.url}/task/{result.id}", Path(shots) / "flower-task.png")
        screenshot(f"{flower.url}/worker/{worker}#tab-other", Path(shots) / "flower-worker.png")
