"""Preload hints in Redis: an autoscaler publishes, per worker it asks for, the models
that worker should load at start; a worker run with ``--compass-preload @hint`` pops one
before it publishes its record and consumes (``worker/runtime.py``). The way a hint
reaches a pod that every replica starts from one spec (``compass_celery.providers``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import keys

#: The ``--compass-preload`` entry that stands for one hint from :func:`publish_hints`.
HINT = "@hint"
#: Seconds a published hint waits for a worker to take it.
HINT_TTL_S = 900


def _hint_key(prefix: str) -> str:
    return keys.key(keys.PRELOAD_HINTS, prefix)


def publish_hints(client: Any, prefix: str, hints: Sequence[Sequence[str]],
                  ttl_s: float = HINT_TTL_S) -> None:
    """Queue one preload hint per worker about to start (a Redis list; each starting
    worker run with ``--compass-preload @hint`` pops one). Hints older than ``ttl_s``
    are dropped with the list, so a scale-out that never came leaves nothing."""
    if not hints:
        return
    key = _hint_key(prefix)
    pipe = client.pipeline()
    pipe.rpush(key, *[",".join(h) for h in hints])
    pipe.expire(key, int(ttl_s))
    pipe.execute()


def take_hint(client: Any, prefix: str) -> list[str]:
    """Pop one published hint (oldest first): its models; none published, none."""
    raw = client.lpop(_hint_key(prefix))
    if raw is None:
        return []
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [m for m in text.split(",") if m]
