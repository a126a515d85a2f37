"""A real three-master Redis Cluster on free local ports, for the whole test session.

``redis-server --cluster-enabled yes`` on three ports, joined with ``redis-cli --cluster
create ... --cluster-replicas 0``, waited on until every node reports ``cluster_state:ok``.
Without ``redis-server``/``redis-cli`` or cluster support the tests skip with the reason;
in CI (``CI`` set) they fail instead, as the other Redis fixtures do.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from compass_celery.local import free_port, wait_until

#: A cluster node also listens on its port + 10000 (the cluster bus).
BUS_OFFSET = 10000


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs a Redis Cluster: {why}")
    pytest.skip(f"no local Redis Cluster: {why}")


@dataclass
class LocalCluster:
    """Three cluster-enabled ``redis-server`` processes joined into one cluster."""

    ports: list[int]
    dir: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The compass state URL of the cluster (every node a startup node)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def nodes(self) -> list[redis.Redis]:
        """A plain client per node."""
        return [redis.Redis(port=p, socket_timeout=5) for p in self.ports]

    def ok(self) -> bool:
        """Whether every node reports ``cluster_state:ok`` and knows three masters."""
        try:
            return all(n.cluster("info")["cluster_state"] == "ok"
                       and int(n.cluster("info")["cluster_known_nodes"]) == 3
                       for n in self.nodes())
        except (redis.RedisError, KeyError, ValueError):
            return False

    def flush(self) -> None:
        """Empty every master (and forget its scripts: a fresh node has none)."""
        for node in self.nodes():
            node.flushall()
            node.script_flush()

    def stop(self) -> None:
        """Stop every node and remove their files."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _node_port() -> int:
    """A free port whose cluster-bus port (+10000) is free too and exists."""
    for _ in range(200):
        port = free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def start_cluster() -> LocalCluster:
    """Start and join a three-master cluster, or skip (fail in CI) saying why not."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        _unavailable("redis-server and redis-cli must be on PATH (apt-get install redis-server)")
    cluster = LocalCluster([_node_port() for _ in range(3)],
                           tempfile.mkdtemp(prefix="compass-redis-cluster-"))
    try:
        for port in cluster.ports:
            node_dir = os.path.join(cluster.dir, str(port))
            os.makedirs(node_dir)
            cluster.procs.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", os.path.join(node_dir, "nodes.conf"),
                 "--cluster-node-timeout", "5000", "--save", "", "--appendonly", "no",
                 "--dir", node_dir, "--daemonize", "no", "--loglevel", "warning",
                 "--logfile", os.path.join(node_dir, "redis.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            wait_until(lambda: all(_answers(p) for p in cluster.ports), 10, "cluster nodes")
        except TimeoutError:
            logs = [Path(cluster.dir, str(p), "redis.log") for p in cluster.ports]
            why = " | ".join(f.read_text(errors="replace").strip()[-200:]
                             for f in logs if f.exists())
            _unavailable(f"redis-server did not start in cluster mode ({why})")
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in cluster.ports),
             "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, timeout=60)
        if created.returncode != 0:
            _unavailable(f"redis-cli --cluster create failed: "
                         f"{(created.stdout + created.stderr).decode(errors='replace')[-300:]}")
        try:
            wait_until(cluster.ok, 30, "cluster_state:ok on every node")
        except TimeoutError as exc:
            _unavailable(str(exc))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def compass_redis_cluster() -> Iterator[LocalCluster]:
    """A real three-master Redis Cluster for the whole test run."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def compass_cluster_url(compass_redis_cluster: LocalCluster) -> str:
    """The cluster's ``redis+cluster://`` URL, every master emptied before each test."""
    compass_redis_cluster.flush()
    return compass_redis_cluster.url
