"""Local processes for the demo, the benchmark and the tests: a private Redis and workers.

Everything started here is stopped by the context managers, so no process is
left behind (the demo's and the test suite's promise).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class LocalRedisError(RuntimeError):
    """No redis-server could be started; the message says how to get one."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; nothing reserves it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class RedisServer:
    """A private ``redis-server`` on a free port, no persistence; ``.url`` to connect.

    We use the ``redis-server`` binary (apt's ``redis-server``; CI installs it)
    rather than an embedded build: it is the same server users deploy, starts in
    milliseconds, and can be killed and restarted to test outages.
    """

    def __init__(self, port: int | None = None, args: Sequence[str] = ()) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise LocalRedisError(
                "redis-server not found on PATH: install it (Debian/Ubuntu: "
                "'apt-get install redis-server', macOS: 'brew install redis') or pass --redis URL")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="compass-redis-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.args = list(args)  # extra redis-server options, e.g. --requirepass, --user

    @property
    def url(self) -> str:
        """The URL to connect to (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Launch redis-server and wait up to 10 s until it answers; returns self."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
             "--loglevel", "warning", *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ping, 10, f"redis-server on port {self.port}")
        return self

    def ping(self) -> bool:
        """Whether the server answers now; raises LocalRedisError once it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise LocalRedisError(f"redis-server exited with {self.proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate the server (kill it after 5 s); its directory stays for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port and directory (an AOF keeps the data)."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class WorkerProcess:
    """A real ``celery worker`` in its own process group (solo pool: one GPU, one task).

    It logs to ``log_path``; without one, to a private temporary folder that :meth:`stop`
    removes, keeping the log's text for :meth:`log` (nothing is left in the temp dir)."""

    def __init__(self, app: str, name: str, args: Sequence[str] = (),
                 env: dict[str, str] | None = None, log_path: str | None = None,
                 wrapper: Sequence[str] = ()) -> None:
        self.app, self.name, self.args = app, name, list(args)
        self.wrapper = list(wrapper)  # e.g. ["ip", "netns", "exec", "host1"]: another "host"
        self.env = {**os.environ, **(env or {})}
        self._private, self._own_dir, self._last_log = log_path is None, None, ""
        self.log_path = log_path or ""  # a private one is made at start
        self.proc: subprocess.Popen[bytes] | None = None

    def _private_log(self) -> str:
        self._own_dir = tempfile.mkdtemp(prefix="compass-worker-")
        return os.path.join(self._own_dir, f"{self.name.replace('@', '_')}.log")

    def start(self) -> WorkerProcess:
        """Launch the worker in a new session (its own process group), logging to ``log_path``."""
        cmd = [*self.wrapper, sys.executable, "-m", "celery", "-A", self.app, "worker",
               "-P", "solo", "-n", self.name, "--loglevel", "INFO", "--without-gossip",
               "--without-mingle", "--without-heartbeat", *self.args]
        if self._private and (self._own_dir is None or not os.path.isdir(self._own_dir)):
            self.log_path = self._private_log()
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=str(Path.cwd()), start_new_session=True)
        log.close()
        return self

    def alive(self) -> bool:
        """Whether the worker process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) to the worker's process group, if it runs."""
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """Warm shutdown: SIGTERM the process group, SIGKILL it after ``timeout`` s."""
        if self.proc is not None and self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if self._own_dir is not None and os.path.isdir(self._own_dir):
            self._last_log = self.log()
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def log(self) -> str:
        """The worker's log so far (empty when it cannot be read); after :meth:`stop`, a
        private log's last text."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return self._last_log
