"""Connecting to Redis: one URL form for a single Redis, Sentinel and Cluster, the error
every caller catches when it is away, and reply decoding.

Used for the state Redis and for the broker's Redis alike (the per-worker queues).
"""

from __future__ import annotations

from typing import Any

from .cluster import connect_cluster, is_cluster_url
from .urls import masked


class StateUnavailable(RuntimeError):
    """The state store cannot be reached; producers fall back to the shared queue."""


def text(value: Any) -> str:
    """A Redis reply as text (the client returns bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def connect(url: str, *, master_name: str | None = None,
            sentinel_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """A redis client for ``url``: redis://, rediss:// (TLS), unix://, Celery's
    ``sentinel://[user:password@]host:port;sentinel://host2:port`` form (the master
    named ``master_name``; ``sentinel_kwargs`` authenticate to the sentinels
    themselves, e.g. ``{"password": ..., "ssl": True}``, as in Celery's
    ``broker_transport_options``), or a Redis Cluster as
    ``redis+cluster://host:port[,host2:port2]`` (``rediss+cluster://`` for TLS).

    Short socket timeouts keep an enqueue from hanging when Redis is away: the
    router then falls back to the shared queue instead.
    """
    import redis

    opts: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0,
                            "health_check_interval": 10}
    opts.update(kwargs)
    if url.startswith("sentinel://"):
        return _sentinel_master(url, master_name, opts, sentinel_kwargs or {})
    if is_cluster_url(url):
        return connect_cluster(url, **opts)
    return redis.Redis.from_url(url, **opts)


def _sentinel_master(url: str, master_name: str | None, opts: dict[str, Any],
                     sentinel_kwargs: dict[str, Any]) -> Any:
    from urllib.parse import unquote, urlparse

    from redis.sentinel import Sentinel

    if not master_name:
        raise StateUnavailable(
            f"state URL {masked(url)!r} is a Sentinel URL but names no master: set "
            "compass_sentinel_master (or broker_transport_options['master_name'])")
    hosts, username, password, db = [], None, None, 0
    for part in url.split(";"):
        u = urlparse(part.strip())
        hosts.append((u.hostname or "127.0.0.1", u.port or 26379))
        username = username or (unquote(u.username) if u.username else None)
        password = password or (unquote(u.password) if u.password else None)
        if u.path.strip("/").isdigit():
            db = int(u.path.strip("/"))
    timeouts = {k: opts[k] for k in ("socket_connect_timeout", "socket_timeout")}
    sentinel = Sentinel(hosts, sentinel_kwargs={**timeouts, **sentinel_kwargs}, **timeouts)
    return sentinel.master_for(master_name, db=db, username=username, password=password,
                               **opts)
