"""RabbitMQ fixtures: a private vhost on the local broker for the whole test session.

The broker is the one at 127.0.0.1:5672 (guest/guest), or ``COMPASS_TEST_AMQP`` as
``host:port``. Each session gets its own vhost (``rabbitmqctl``, else the
management HTTP API), deleted at the end. Without a broker the tests skip with the
reason; in CI (``CI`` set) they fail instead, as the Redis fixtures do.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

HOST, PORT = (os.environ.get("COMPASS_TEST_AMQP") or "127.0.0.1:5672").rsplit(":", 1)
API = f"http://{HOST}:15672/api"


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs RabbitMQ at {HOST}:{PORT}: {why}")
    pytest.skip(f"no RabbitMQ at {HOST}:{PORT} ({why}); start one, e.g. "
                "'apt-get install rabbitmq-server' or 'docker run -p 5672:5672 rabbitmq'")


def _answers() -> bool:
    try:
        with socket.create_connection((HOST, int(PORT)), timeout=1.0) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            return len(s.recv(8)) > 0
    except OSError:
        return False


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


def _api(method: str, path: str, body: dict | None = None) -> None:
    req = urllib.request.Request(f"{API}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"content-type": "application/json",
                                          "authorization": "Basic " + base64.b64encode(
                                              b"guest:guest").decode()})
    urllib.request.urlopen(req, timeout=10).close()


def create_vhost(vhost: str) -> None:
    """Create ``vhost`` with full rights for guest (rabbitmqctl, else the HTTP API)."""
    quoted = urllib.request.quote(vhost, safe="")
    if shutil.which("rabbitmqctl"):
        try:
            _ctl("add_vhost", vhost)
            _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
            return
        except (subprocess.SubprocessError, OSError):
            pass  # no rights on the node's cookie: try the HTTP API
    _api("PUT", f"/vhosts/{quoted}", {})
    _api("PUT", f"/permissions/{quoted}/guest", {"configure": ".*", "write": ".*",
                                                  "read": ".*"})


def delete_vhost(vhost: str) -> None:
    """Delete ``vhost`` and everything in it (best effort)."""
    try:
        if shutil.which("rabbitmqctl"):
            _ctl("delete_vhost", vhost)
        else:
            _api("DELETE", f"/vhosts/{urllib.request.quote(vhost, safe='')}")
    except (subprocess.SubprocessError, OSError):
        pass


@pytest.fixture(scope="session")
def amqp_vhost_url() -> Iterator[str]:
    """``amqp://guest:guest@host:port/<vhost>`` of a vhost private to this session."""
    if not _answers():
        _unavailable("nothing answers AMQP there")
    vhost = f"compass-test-{uuid.uuid4().hex[:8]}"
    try:
        create_vhost(vhost)
    except (subprocess.SubprocessError, OSError) as exc:
        _unavailable(f"cannot create a vhost: {exc}")
    yield f"amqp://guest:guest@{HOST}:{PORT}/{vhost}"
    delete_vhost(vhost)


@pytest.fixture
def amqp_url(amqp_vhost_url: str) -> str:
    """The session vhost, with the queues tests share (shared, default) emptied."""
    from kombu import Connection

    with Connection(amqp_vhost_url) as conn:
        for name in ("compass.shared", "celery"):
            channel = conn.channel()
            channel.queue_delete(name)
            channel.close()
    return amqp_vhost_url
