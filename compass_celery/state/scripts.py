"""The Lua scripts shipped beside the code, read once per process, and the one way to
register them on a client.

Every atomic multi-key step compass takes in Redis is one of these scripts, so
the step is visible in one file and its KEYS/ARGV contract is written at its top.
Each lives beside the code that runs it, in ``<subpackage>/lua/<name>.lua``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from .cluster import ClusterScript, PipelinedScript, is_cluster_client

#: The subpackage of ``compass_celery`` each script lives in, beside the code that runs it.
HOMES: dict[str, str] = {
    **dict.fromkeys(("changelog", "counter", "ewma", "publish", "remove", "snapshot"),
                    "state"),
    **dict.fromkeys(("complete", "fail", "once"), "jobs"),
    **dict.fromkeys(("stage", "move", "lease"), "broker"),
}


@cache
def script(name: str) -> str:
    """The source of script ``name`` (``compass_celery/<home>/lua/<name>.lua``)."""
    path = f"{HOMES[name]}/lua/{name}.lua"
    return resources.files("compass_celery").joinpath(path).read_text()


def register_script(client: Any, *names: str) -> Any:
    """The scripts ``names`` joined into one (``"changelog", "counter"``: changelog.lua's
    helpers in front of counter.lua), registered on ``client``: on a Redis Cluster a
    :class:`~compass_celery.state.cluster.ClusterScript` (cluster pipelines can run it),
    otherwise a :class:`~compass_celery.state.cluster.PipelinedScript` (pipelines run it
    without a SCRIPT EXISTS round trip; called directly it is redis-py's script)."""
    source = "".join(script(name) for name in names)
    if is_cluster_client(client):
        return ClusterScript(client, source)
    return PipelinedScript(client, source)
