"""kombu's Redis transport as compass must see it: lists, priorities, in-flight work.

Compass owns per-worker queues, so it must find every message of one: kombu
keeps a queue as one list per priority step (``<queue>\\x06\\x16<step>``), puts
a consumed-but-unacked message in its ``unacked`` hash (``[message, exchange,
routing_key]``) and may prefix every key (``global_keyprefix``). Those details
live here and nowhere else..
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRIORITY_STEPS = (0, 3, 6, 9)     # kombu's default for Redis
PRIORITY_SEP = "\x06\x16"         # kombu's default ``sep``


@dataclass(frozen=True)
class RedisLayout:
    """Where kombu's Redis transport keeps a queue's messages."""

    steps: tuple[int, ...] = PRIORITY_STEPS
    sep: str = PRIORITY_SEP
    keyprefix: str = ""
    unacked: str = "unacked"
    unacked_index: str = "unacked_index"

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> RedisLayout:
        """From ``broker_transport_options`` (the same names kombu reads)."""
        o = dict(options or {})
        steps = tuple(sorted(int(s) for s in o.get("priority_steps", PRIORITY_STEPS)))
        return cls(steps=steps or (0,), sep=str(o.get("sep", PRIORITY_SEP)),
                   keyprefix=str(o.get("global_keyprefix", "") or ""),
                   unacked=str(o.get("unacked_key", "unacked")),
                   unacked_index=str(o.get("unacked_index_key", "unacked_index")))

    def lists(self, queue: str) -> list[str]:
        """The Redis lists of ``queue``, in the order kombu consumes them."""
        names = [queue] + [f"{queue}{self.sep}{s}" for s in self.steps if s]
        return [self.keyprefix + n for n in names]

    def list_for(self, queue: str, priority: Any) -> str:
        """The list kombu would push a message of ``priority`` to (its ``_q_for_pri``)."""
        try:
            pri = max(0, min(int(priority), 9))
        except (TypeError, ValueError):
            pri = 0
        step = max((s for s in self.steps if s <= pri), default=0)
        return self.keyprefix + (f"{queue}{self.sep}{step}" if step else queue)


class MessageError(ValueError):
    """A raw entry in a compass queue is not a Celery message; says why."""


def parse_message(raw: bytes | str) -> dict[str, Any]:
    """A raw list entry (a kombu message, or an unacked ``[message, ex, rk]``) as a message.

    Raises :class:`MessageError` naming the problem: recovery dead-letters such
    entries instead of dropping or retrying them for ever.
    """
    try:
        body = json.loads(raw)
    except (ValueError, TypeError, RecursionError) as exc:
        raise MessageError(f"not JSON ({str(exc)[:80]})") from None
    if isinstance(body, list):  # an unacked entry: [message, exchange, routing_key]
        if len(body) != 3 or not isinstance(body[0], dict):
            raise MessageError("an unacked entry that is not [message, exchange, routing_key]")
        body = body[0]
    if not isinstance(body, dict):
        raise MessageError(f"a JSON {type(body).__name__}, not a message object")
    headers = body.get("headers")
    if not isinstance(headers, dict) or not isinstance(headers.get("task"), str) \
            or not headers.get("id") or "body" not in body \
            or not isinstance(body.get("properties"), dict):
        raise MessageError("not a Celery task message (no headers.task/id, body, properties)")
    return body


def message_headers(raw: bytes | str) -> dict[str, Any]:
    """A message's headers, or {} for anything unreadable (advisory readers only)."""
    try:
        msg = json.loads(raw)
        headers = msg.get("headers") or {}
        if not headers and msg.get("body") and msg.get("properties", {}).get(
                "body_encoding") == "base64":
            headers = json.loads(base64.b64decode(msg["body"])).get("headers", {})
        return headers if isinstance(headers, dict) else {}
    except (ValueError, TypeError, AttributeError):
        return {}


def peek(client: Any, layout: RedisLayout, queue: str, limit: int = -1) -> list[bytes]:
    """The next ``limit`` raw messages of ``queue`` (all when -1), next first.

    kombu LPUSHes and BRPOPs, so a list's next message is its right end.
    """
    return list(reversed(client.lrange(layout.lists(queue)[0], -limit if limit > 0 else 0, -1)))
