"""The Lua scripts shipped beside the code, read once per process; the one way to
register them on a client; and running them in pipelines.

Every atomic multi-key step compass takes in Redis is one of these scripts, so
the step is visible in one file and its KEYS/ARGV contract is written at its top.
Each lives beside the code that runs it, in ``<subpackage>/lua/<name>.lua``.

On one Redis, a pipeline runs its scripts by EVALSHA without asking first
(:class:`PipelinedScript`, :func:`run_pipeline`): redis-py's own scripts make every
pipeline that carries one ask SCRIPT EXISTS before it runs, a round trip on the path
of every task. A cluster pipeline runs them with EVAL (:class:`ClusterScript`), since a
node that never saw a script (a new primary after a failover) would fail a pipelined
EVALSHA after the pipeline's other commands had already run.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from functools import cache
from importlib import resources
from typing import Any

from .cluster import is_cluster_client

#: The subpackage of ``compass_celery`` each script lives in, beside the code that runs it.
HOMES: dict[str, str] = {
    **dict.fromkeys(("changelog", "counters", "learn", "publish", "remove", "snapshot"),
                    "state"),
    **dict.fromkeys(("complete", "fail", "once"), "jobs"),
    **dict.fromkeys(("stage", "move", "lease", "promote", "claim", "fetch", "inflight",
                     "unfetch", "push"),
                    "broker"),
}


@cache
def script(name: str) -> str:
    """The source of script ``name`` (``compass_celery/<home>/lua/<name>.lua``)."""
    path = f"{HOMES[name]}/lua/{name}.lua"
    return resources.files("compass_celery").joinpath(path).read_text()


#: Per client, the scripts registered on it (by names): registering hashes the whole
#: source (SHA1, ~12 us), and a job's submission registers once.lua twice.
_registered: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Any]] = \
    weakref.WeakKeyDictionary()


def register_script(client: Any, *names: str) -> Any:
    """The scripts ``names`` joined into one (``"changelog", "counters"``: changelog.lua's
    helpers in front of counters.lua), registered on ``client``: on a Redis Cluster a
    :class:`~compass_celery.state.scripts.ClusterScript` (cluster pipelines can run it),
    otherwise a :class:`~compass_celery.state.scripts.PipelinedScript` (pipelines run it
    without a SCRIPT EXISTS round trip; called directly it is redis-py's script). The
    same client and names give the same object (it holds nothing but the two)."""
    try:
        mine = _registered.get(client)
    except TypeError:  # a client that cannot be weakly referenced: registered anew
        mine = None
    found = mine.get(names) if mine is not None else None
    if found is not None:
        return found
    source = "".join(script(name) for name in names)
    made = ClusterScript(client, source) if is_cluster_client(client) \
        else PipelinedScript(client, source)
    with contextlib.suppress(TypeError):
        _registered.setdefault(client, {})[names] = made
    return made


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
        # a direct call (client None, the common case) skips the isinstance: Pipeline's
        # metaclass is typing's _ProtocolMeta, whose check costs microseconds a call
        if client is not None and isinstance(client, _pipeline_class()):
            with _queued_lock:
                _queued.setdefault(client, []).append((len(client), self._script, keys, args))
            return client.evalsha(self._script.sha, len(keys), *keys, *args)
        return self._script(keys=keys, args=args, client=client)


@cache
def _pipeline_class() -> type:
    """redis-py's :class:`~redis.client.Pipeline` (imported once, not on every call)."""
    from redis.client import Pipeline

    return Pipeline


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

