"""The atomic fetch: kombu's Redis consumer of compass queues, without its fetch window.

kombu's Redis transport takes a message with BRPOP and only then writes its unacked entry;
a worker killed in between loses the message. Here a compass worker's channel takes each
message into flight (kombu's unacked hash and index, with a compass lease) in one Lua step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from ..planner.priority import DEFAULT_PRIORITY, broker_priority
from ..state.scripts import script

#: Longest the consumer's blocking wait (a BLMOVE of one list into its fetch list) lasts
#: before it looks at every list again: while a worker is idle, what arrives on a list it
#: does not block on waits at most this long (the list it blocks on wakes it at once).
FETCH_BLOCK_S = 0.05

logger = logging.getLogger("compass_celery.broker")

# -- the atomic fetch: kombu's BRPOP, without its window -------------------------------------
_FETCH: dict[str, tuple[str, str]] = {}  # own queue -> (its fetch list, the leases zset)


def fetch_key(prefix: str, queue: str) -> str:
    """The fetch list of ``queue``'s consumer: what its blocking wait moved out of a list."""
    return f"{prefix}:fetch:{queue}"


def install_atomic_fetch(queue: str, fetch_list: str, leases_key: str) -> None:
    """Make this process's kombu Redis consumer of ``queue`` fetch atomically.

    kombu BRPOPs and then writes its unacked entry: a message Redis hands to a worker
    killed in between (or to a connection of a process already dead, before Redis saw
    it close) is in neither place, and nothing can find it. Here a channel consuming
    ``queue`` instead runs fetch.lua, which moves the next message (kombu's order:
    priority lists, then queues) into kombu's unacked hash and index with a compass
    lease, in one step; with nothing to take, it blocks with a BLMOVE of one list into
    ``fetch_list`` (an atomic move: a dead worker's arrival waits there, drained with
    its queue), then looks again. Acks, rejects, the visibility timeout and prefetch
    are kombu's own, unchanged. A Redis that refuses either command (< 6.2) gets
    kombu's BRPOP back, with a warning. Installed by the compass worker (idempotent).
    """
    import kombu.transport.redis as kredis

    _FETCH[queue] = (fetch_list, leases_key)
    channel = kredis.Channel
    if getattr(channel._brpop_start, "compass_fetch", False):
        return
    start, read = channel._brpop_start, channel._brpop_read

    def _brpop_start(self: Any, timeout: Any = None) -> Any:
        own = _own_queue(self)
        return start(self, timeout) if own is None else _fetch_start(self, own)

    def _brpop_read(self: Any, **options: Any) -> Any:
        if getattr(self, "_compass_cmd", None) is None:
            return read(self, **options)
        return _fetch_read(self, **options)

    _brpop_start.compass_fetch = True  # type: ignore[attr-defined]
    channel._brpop_start, channel._brpop_read = _brpop_start, _brpop_read


def _own_queue(channel: Any) -> str | None:
    """The compass queue ``channel`` consumes atomically, None for kombu's own BRPOP."""
    if getattr(channel, "_compass_off", False):
        return None
    return next((q for q in _FETCH if q in channel.active_queues), None)


def _fetch_start(channel: Any, own: str) -> None:
    """Send the next look (fetch.lua) or, after one found nothing, the blocking wait."""
    queues = channel._queue_cycle.consume(len(channel.active_queues))
    if not queues:
        return
    pre = channel.global_keyprefix or ""
    lists = [pre + channel._q_for_pri(q, pri) for pri in channel.priority_steps for q in queues]
    fetch_list, leases = _FETCH[own]
    conn = channel.client.connection
    channel._in_poll = conn
    channel._brpop_sent_at = time.monotonic()
    if getattr(channel, "_compass_idle", False):
        wake = getattr(channel, "_compass_wake", None)
        if wake not in lists:  # until a message came: compass's default level
            wake = pre + channel._q_for_pri(own, broker_priority(DEFAULT_PRIORITY, redis=True))
        channel._compass_cmd = "BLMOVE"
        conn.send_command("BLMOVE", wake, fetch_list, "RIGHT", "LEFT", FETCH_BLOCK_S)
        return
    channel._compass_cmd = "EVAL"
    conn.send_command("EVAL", _fetch_script(), 4 + len(lists), pre + channel.unacked_key,
                      pre + channel.unacked_index_key, leases, fetch_list, *lists,
                      repr(time.time()))


def _fetch_read(channel: Any, **options: Any) -> bool:
    """Read the reply :func:`_fetch_start` asked for; deliver a message as kombu does."""
    import kombu.transport.redis as kredis
    from kombu.utils.encoding import bytes_to_str

    cmd, client = channel._compass_cmd, channel.client
    try:
        try:
            reply = client.parse_response(client.connection, cmd, **options)
        except channel.connection_errors:
            client.connection.disconnect()  # the next round reconnects
            raise
        except channel.ResponseError as exc:
            channel._compass_off = True
            logger.warning("compass: Redis refused the atomic fetch (%s); this worker "
                           "consumes with kombu's BRPOP", exc)
            raise kredis.Empty() from None
        channel._compass_idle = cmd == "EVAL" and not reply
        if cmd == "BLMOVE" or not reply:
            raise kredis.Empty()
        src, raw = bytes_to_str(reply[0]), bytes_to_str(reply[1])
        dest = _destination(channel, src, raw)
        if src not in {f for f, _ in _FETCH.values()}:
            channel._compass_wake = src  # the list traffic comes on: block on it next
        with contextlib.suppress(ValueError):
            channel._queue_cycle.rotate(dest)
        channel.connection._deliver(kredis.loads(raw), dest)
        return True
    finally:
        channel._in_poll = None
        channel._compass_cmd = None
        flush = getattr(channel, "_flush_brpop_reauth", None)
        if flush is not None:
            flush()


def _destination(channel: Any, src: str, raw: str) -> str:
    """The queue a fetched message is delivered to: its list's, as kombu's BRPOP reads
    it; for the fetch list, the message's routing key (else the compass queue)."""
    pre = channel.global_keyprefix or ""
    for own, (fetch_list, _) in _FETCH.items():
        if src == fetch_list:
            routing = message_routing_key(raw)
            return routing if routing in channel.active_queues else own
    name = src[len(pre):] if pre and src.startswith(pre) else src
    return name.rsplit(channel.sep, 1)[0]


def message_routing_key(raw: bytes | str) -> str | None:
    """The routing key a raw kombu message was published with (None if unreadable)."""
    try:
        key = json.loads(raw)["properties"]["delivery_info"]["routing_key"]
    except (ValueError, TypeError, KeyError):
        return None
    return key if isinstance(key, str) else None


def _fetch_script() -> str:
    """fetch.lua's source (sent whole: EVAL needs no reload after a Redis restart)."""
    return script("inflight") + script("fetch")
