"""What the benchmark counts after a run: executions per task id and stranded messages.

``duplicates`` come from a ledger in a second private Redis that no fault touches;
``stranded`` are messages left in a queue, a staging list or kombu's unacked hash
once every job ended.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..broker.kombu_redis import RedisLayout
from ..state import keys


def ledger_counts(ledger: Any, key: str) -> dict[str, int]:
    """The ledger hash ``key``: task id -> how many executions it counted."""
    return {(k.decode() if isinstance(k, bytes) else k): int(v)
            for k, v in ledger.hgetall(key).items()}


def _owned(routing_key: str, prefix: str) -> bool:
    return routing_key.startswith((f"{prefix}.w.", f"{prefix}.shared"))


def _unacked_entries(client: Any, prefix: str) -> list[bytes]:
    """Delivery tags of kombu ``unacked`` entries routed to this run's queues."""
    layout = RedisLayout()
    tags = []
    for tag, raw in client.hgetall(layout.keyprefix + layout.unacked).items():
        try:
            _, _, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if isinstance(routing_key, str) and _owned(routing_key, prefix):
            tags.append(tag)
    return tags


def forget_unacked(client: Any, prefix: str) -> None:
    """A previous run's in-flight entries of these queues would count as stranded."""
    layout = RedisLayout()
    tags = _unacked_entries(client, prefix)
    if tags:
        client.hdel(layout.keyprefix + layout.unacked, *tags)
        client.zrem(layout.keyprefix + layout.unacked_index, *tags)


def stranded_messages(client: Any, prefix: str, worker_names: Sequence[str]
                      ) -> dict[str, int]:
    """Messages still waiting anywhere once every job ended: each worker queue and the
    shared queue (every priority list), each staging list, and kombu's unacked
    hash."""
    layout = RedisLayout()
    queues = {f"{prefix}.shared", *(f"{prefix}.w.{n}" for n in worker_names)}
    for raw in client.scan_iter(f"{prefix}.w.*"):  # queues of names not in this cluster
        name = raw.decode("utf-8", "replace")
        queues.add(name.split(layout.sep)[0])
    out: dict[str, int] = {}
    for queue in sorted(queues):
        for name in layout.lists(queue):
            out[name.replace(layout.sep, "/")] = int(client.llen(name))
    for raw in client.scan_iter(keys.key(keys.STAGING, prefix, queue="*")):
        out[raw.decode("utf-8", "replace")] = int(client.llen(raw))
    out["unacked"] = len(_unacked_entries(client, prefix))
    return out


def stranded_amqp(queues: Any, prefix: str, worker_names: Sequence[str]) -> dict[str, int]:
    """Over RabbitMQ: messages still waiting in each worker queue and the shared queue
    once every job ended (unacked ones return to them when their consumer goes)."""
    names = [f"{prefix}.shared", *(f"{prefix}.w.{n}" for n in worker_names)]
    return {name: queues.waiting(name) for name in names}
