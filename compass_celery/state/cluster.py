"""Scripts in pipelines, and compass state on a Redis Cluster (the ``redis+cluster://`` URL).

On one Redis, a pipeline runs its scripts by EVALSHA without asking first
(:class:`PipelinedScript`, :func:`run_pipeline`): redis-py's own scripts make every
pipeline that carries one ask SCRIPT EXISTS before it runs, a round trip on the path
of every task.

Only compass's own keys (worker records, beats, counters, change log, profiles,
jobs, recovery's locks) may live on a cluster; kombu's Redis transport, the
broker, needs a single Redis or Sentinel. Every multi-key step compass takes
stays in one hash slot (see :mod:`compass_celery.state.keys`), and a cluster pipeline
runs its scripts with EVAL, since a node that never saw a script (a new
primary after a failover) would fail a pipelined EVALSHA after the pipeline's
other commands had already run.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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
            raise ValueError(f"cluster URL {url!r}: expected host:port, got {hostport!r}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError(f"cluster URL {url!r} names no node")
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


class ClusterScript:
    """A Lua script registered on a cluster client: called directly it uses EVALSHA (loaded
    on the key's node when missing), queued on a cluster pipeline it is sent whole (EVAL)."""

    def __init__(self, client: Any, source: str) -> None:
        self.client, self.source = client, source
        self._script = client.register_script(source)

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        """Run the script with ``keys`` and ``args`` (on ``client`` when given)."""
        keys, args = list(keys or []), list(args or [])
        target = client if client is not None else self.client
        from redis.cluster import ClusterPipeline

        if isinstance(target, ClusterPipeline):
            return target.execute_command("EVAL", self.source, len(keys), *keys, *args)
        return self._script(keys=keys, args=args, client=target)


#: Per pipeline, the :class:`PipelinedScript` calls queued on it, as (reply index, script,
#: keys, args): this module's table, not the pipeline's attributes, and gone with the
#: pipeline. Pipelines are queued on and run from several threads: the lock guards it.
_queued: weakref.WeakKeyDictionary[Any, list[tuple[int, Any, list[Any], list[Any]]]] = \
    weakref.WeakKeyDictionary()
_queued_lock = threading.Lock()


class PipelinedScript:
    """A Lua script that a pipeline runs by EVALSHA without asking SCRIPT EXISTS first.

    Redis loads it on its first direct call (redis-py's :class:`~redis.commands.core.Script`
    does that on a NOSCRIPT reply). Queued on a pipeline, it is remembered (in this
    module's table, by pipeline), so that :func:`run_pipeline` can re-run just the commands
    that found it missing (a Redis that restarted or flushed its scripts): a missing script
    ran nothing, so each runs once.
    """

    def __init__(self, client: Any, source: str) -> None:
        self._script = client.register_script(source)

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        """Run the script with ``keys`` and ``args`` (queued on ``client`` when a pipeline)."""
        keys, args = list(keys or []), list(args or [])
        from redis.client import Pipeline

        if isinstance(client, Pipeline):
            with _queued_lock:
                _queued.setdefault(client, []).append((len(client), self._script, keys, args))
            return client.evalsha(self._script.sha, len(keys), *keys, *args)
        return self._script(keys=keys, args=args, client=client)


def run_pipeline(pipe: Any) -> list[Any]:
    """``pipe.execute()``, re-running any :class:`PipelinedScript` that found its script
    missing (loading it first); any other error is raised as ``execute`` would."""
    with _queued_lock:
        queued = _queued.pop(pipe, ())
    if not queued:
        return pipe.execute()
    from redis.exceptions import NoScriptError

    replies = pipe.execute(raise_on_error=False)
    for at, script, keys, args in queued:
        if isinstance(replies[at], NoScriptError):
            replies[at] = script(keys=keys, args=args)  # loads it, runs it once
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies

