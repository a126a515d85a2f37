"""Compass state on a Redis Cluster (the ``redis+cluster://`` URL).

Only compass's own keys (worker records, beats, counters, change log, profiles,
jobs, recovery's locks) may live on a cluster; kombu's Redis transport, the
broker, needs a single Redis or Sentinel. Every multi-key step compass takes
stays in one hash slot (see :mod:`compass_celery.state.keys`); how a cluster pipeline
runs its scripts is in :mod:`compass_celery.state.scripts`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .urls import masked

#: State URL schemes of a Redis Cluster: ``redis+cluster://host:port[,host2:port2]``.
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return bool(url) and str(url).startswith(CLUSTER_SCHEMES)


def connect_cluster(url: str, **opts: Any) -> Any:
    """A ``redis.cluster.RedisCluster`` for ``redis+cluster://[user:pass@]host:port[,host:port]
    [?option=value]`` (``rediss+cluster://`` for TLS); every listed node is a startup node."""
    from redis.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    auth, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for hostport in filter(None, hosts.split(",")):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"cluster URL {masked(url)!r}: expected host:port, got {hostport!r}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError(f"cluster URL {masked(url)!r} names no node")
    first = f"{auth}@{hosts.split(',')[0]}" if auth else hosts.split(",")[0]
    plain = urlunsplit((scheme, first, "", parts.query, ""))
    return RedisCluster.from_url(plain, startup_nodes=[ClusterNode(h, p) for h, p in nodes[1:]],
                                 **opts)


def unavailable_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean the state Redis (or cluster) cannot be reached now."""
    import redis
    from redis.exceptions import ClusterError, RedisClusterException

    return (redis.ConnectionError, redis.TimeoutError, ClusterError, RedisClusterException,
            OSError)


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` is a cluster client or a cluster pipeline."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py always ships it
        return False
    return isinstance(client, RedisCluster)
