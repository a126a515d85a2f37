"""A worker on another "host" (its own network namespace) cut off from Redis, then back."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from compass_celery.local import RedisServer, WorkerProcess, wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import GPU, compass_keys_left, executions, wait_live
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
NS, HOST_IF, NS_IF = "compass-h1", "cmp-h0", "cmp-h1"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def other_host() -> Iterator[str]:
    """A network namespace joined to this one by a veth pair; yields the namespace."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 ('ip') to make a network namespace")
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    try:
        _ip("netns", "add", NS)
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _ip("link", "set", NS_IF, "netns", NS)
        _ip("addr", "add", f"{HOST_IP}/24", "dev", HOST_IF)
        _ip("link", "set", HOST_IF, "up")
        _ip("netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/24", "dev", NS_IF)
        _ip("netns", "exec", NS, "ip", "link", "set", NS_IF, "up")
        _ip("netns", "exec", NS, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        pytest.skip(f"cannot make a network namespace here: {exc.stderr!r}")
    yield NS
    subprocess.run(["ip", "link", "del", HOST_IF], capture_output=True)
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def test_a_worker_cut_off_for_twice_the_timeout_loses_nothing(other_host, tmp_path):
    with RedisServer(args=["--bind", "127.0.0.1", HOST_IP, "--protected-mode", "no"]) as r:
        env = {"COMPASS_JOBAPP_HEARTBEAT_TIMEOUT_S": "1.0"}
        cut = WorkerProcess("tests.support.jobapp", "cut@h1", GPU, env={
            **env, "COMPASS_BROKER_URL": f"redis://{HOST_IP}:{r.port}/0"},
            wrapper=["ip", "netns", "exec", other_host],
            log_path=str(tmp_path / "cut.log")).start()
        stay = WorkerProcess("tests.support.jobapp", "stay@h0", GPU,
                             env={**env, "COMPASS_BROKER_URL": r.url},
                             log_path=str(tmp_path / "stay.log")).start()
        ws = [cut, stay]
        try:
            app = make_app(r.url, compass_snapshot_ttl_s=0.0, compass_heartbeat_timeout_s=1.0)
            wait_live(app, 2, ws)
            import redis

            app.log = redis.Redis.from_url(r.url)
            results = [app.tasks["j.heavy"].delay(i) for i in range(12)]
            on_cut = [x for x in results if app.compass.placement(x.id).worker == "cut@h1"]
            assert on_cut
            wait_until(lambda: any(executions(app)[x.id] for x in on_cut), 20,
                       "the cut worker to be running")
            _ip("link", "set", HOST_IF, "down")  # cut the "host" off
            try:
                time.sleep(2.5)  # the cut's length, the test's subject: > 2x the timeout
            finally:
                _ip("link", "set", HOST_IF, "up")
            values = sorted(x.get(timeout=60) for x in results)
            assert values == list(range(12)), worker_logs(ws)
            runs = executions(app)
            assert sorted(runs) == sorted(x.id for x in results)  # nothing lost
            # the named at-least-once window: what the cut worker had in flight (prefetch 1)
            assert sum(n - 1 for n in runs.values()) <= 1, runs
            assert "cut@h1 is dead" in stay.log(), worker_logs(ws)
            wait_live(app, 2, ws, timeout=20)  # it re-publishes and is chosen again
            assert compass_keys_left(app, [app.compass.queue_for("cut@h1"),
                                           app.compass.queue_for("stay@h0")]) == {}
        finally:
            for w in ws:
                w.stop()
