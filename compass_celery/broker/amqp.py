"""RabbitMQ as compass's broker: the queue steps of hand-back and recovery over AMQP.

Compass's own state (worker records, backlogs, jobs, the dead-queue set and
the dead-letter list) stays in Redis (``compass_redis_url``); only the task
messages live in RabbitMQ. What differs from the Redis transport:

- **No staging.** A drain takes one message at a time with ``basic.get`` (no
  consumer), re-places it, publishes the copy to its new queue with publisher
  confirms, and only then acks the original. Until the ack, the broker holds
  the original as unacked on the drainer's connection, and returns it to its
  queue if the drainer dies: nothing is ever only in a drainer's memory.
- **Moves are marked in Redis.** Before publishing, the original's identity
  (task id, retries, copy id) is marked ``moving``; after the broker's confirm,
  ``moved``. A redelivered original already ``moved`` is acked without being
  published again. One whose mark is ``moving`` is published again: if the
  broker had confirmed the first copy before the drainer died (or before Redis
  took the ``moved`` mark), that task is now queued twice. That crash between
  the broker's confirm and the Redis mark is the one duplicate window.
- **No leases.** RabbitMQ returns a lost connection's unacked messages to
  their queue by itself, at once for a dead process and after the heartbeat
  for a lost host; a same-name restart simply consumes its queue again.
- **No peeking.** A queue cannot be read without consuming it: the worker's
  prefetch lookahead sees no queued models, and its backlog is reconciled from
  charges (reset to its running tasks only when its queue is empty).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..state import keys
from .kombu_redis import dead_entry

logger = logging.getLogger("compass_celery.broker")

#: Broker URLs served by kombu's AMQP transports.
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://", "pyamqps://")
#: How long a moved message copy's mark (:data:`compass_celery.state.keys.AMQP_MOVE`) is
#: kept: a redelivery comes within seconds.
MOVE_TTL_S = 24 * 3600
#: Header naming one copy of a task message; a move gives the new copy a fresh one.
COPY_HEADER = "compass_copy"
#: Message properties a moved copy keeps (the rest are the broker's or per delivery).
KEPT_PROPERTIES = ("delivery_mode", "priority", "correlation_id", "reply_to", "expiration",
                   "message_id", "type", "app_id")
CONFIRM_TIMEOUT_S = 30.0


#: ``x-max-priority`` of compass queues on RabbitMQ: levels 0..9, 9 served first.
MAX_PRIORITY = 9


def declare_with_priority(queues: Any, prefix: str, shared: str) -> None:
    """Make Celery's queue table (``app.amqp.queues``) declare compass's queues, each
    worker's (``prefix``...) and ``shared``, as RabbitMQ priority queues. Every path that
    names a queue (a publish, a worker's consume, a drain) goes through its
    ``new_missing``, so all declare it alike (RabbitMQ refuses a redeclaration with other
    arguments). A queue declared before without it must be deleted once."""
    if getattr(queues, "compass_priority", False):
        return
    plain = queues.new_missing

    def new_missing(name: str) -> Any:
        queue = plain(name)
        if name == shared or name.startswith(prefix):
            args = dict(queue.queue_arguments or {})
            args.setdefault("x-max-priority", MAX_PRIORITY)
            queue.queue_arguments = args
        return queue

    queues.new_missing = new_missing
    queues.compass_priority = True


def is_amqp(url: str | None) -> bool:
    """Whether ``url`` is a broker URL kombu serves over AMQP (RabbitMQ)."""
    return bool(url) and str(url).startswith(AMQP_SCHEMES)


@dataclass
class _Taken:
    """A message this drainer got and has not acked yet."""

    tag: int
    raw: bytes
    mark: str


def envelope(msg: Any) -> bytes:
    """An AMQP message as the JSON envelope recovery reads (kombu's Redis format:
    base64 body, headers, properties with ``delivery_info``)."""
    props = dict(getattr(msg, "properties", None) or {})
    body = msg.body if isinstance(msg.body, bytes) else str(msg.body).encode()
    info = getattr(msg, "delivery_info", None) or {}
    out = {"body": base64.b64encode(body).decode(),
           "content-type": props.get("content_type"),
           "content-encoding": props.get("content_encoding"),
           "headers": props.get("application_headers") or {},
           "properties": {**{k: props[k] for k in KEPT_PROPERTIES if props.get(k) is not None},
                          "body_encoding": "base64",
                          "delivery_info": {"exchange": info.get("exchange", ""),
                                            "routing_key": info.get("routing_key", "")}}}
    return json.dumps(out, default=str).encode()


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _mark_id(headers: Any) -> str | None:
    """The identity of one message copy: task id, retries and copy id."""
    if not isinstance(headers, dict) or not headers.get("id"):
        return None
    return f"{headers['id']}:{headers.get('retries', 0)}:{headers.get(COPY_HEADER) or '0'}"


class AmqpQueues:
    """The :class:`~compass_celery.broker.kombu_redis.BrokerQueues` steps on RabbitMQ, with the
    move marks and the dead-letter list in the state Redis (``client``).

    One connection per process (opened on first use, again after any error: the
    broker then returns whatever this drainer held); thread-safe.
    """

    returns_unacked = True
    peekable = False

    def __init__(self, app: Any, client: Any, prefix: str) -> None:
        self.app, self.client, self.prefix = app, client, prefix
        self._lock = threading.RLock()
        self._conn: Any = None
        self._channel: Any = None
        self._probe: Any = None  # for passive declares, which close a channel on 404
        self._pid = 0
        self._declared: set[str] = set()
        self._taken: dict[tuple[int, str], _Taken] = {}
        self._budget: dict[tuple[int, str], int] = {}
        self.skipped = 0  # redelivered originals found already moved: acked, not re-sent

    @property
    def dead_letter_key(self) -> str:
        """The Redis list of unusable messages, each with its queue and the reason."""
        return keys.key(keys.DEAD_LETTER, self.prefix)

    def mark_key(self, mark_id: str) -> str:
        """The Redis key of one message copy's move mark."""
        return keys.key(keys.AMQP_MOVE, self.prefix, id=mark_id)

    # -- connection ---------------------------------------------------------------------
    def _chan(self) -> Any:
        if self._pid != os.getpid():  # forked: the parent's socket is not ours to use
            self._conn = self._channel = self._probe = None
            self._taken.clear()
            self._pid = os.getpid()
        if self._channel is None:
            conn = self.app.connection_for_write()
            conn.connect()
            self._conn, self._channel = conn, conn.channel()
            self._declared.clear()
        return self._channel

    def _reset(self) -> None:
        """Drop the connection; the broker returns every message it held to its queue."""
        conn, self._conn, self._channel, self._probe = self._conn, None, None, None
        self._taken.clear()
        self._declared.clear()
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to close cleanly
                conn.close()

    def _guarded(self, step: Callable[[], Any]) -> Any:
        with self._lock:
            try:
                return step()
            except Exception:
                self._reset()
                raise

    def counts(self, queue: str) -> tuple[int, int]:
        """(waiting messages, consumers) of ``queue``; (0, 0) when it does not exist."""
        from amqp.exceptions import NotFound

        def count() -> tuple[int, int]:
            self._chan()
            if self._probe is None:
                self._probe = self._conn.channel()
            try:
                ok = self._probe.queue_declare(queue, passive=True)
            except NotFound:
                self._probe = None  # the broker closed that channel (not the drain's)
                return 0, 0
            return int(ok.message_count), int(ok.consumer_count)
        return self._guarded(count)

    def declare(self, queue: str) -> None:
        """Declare ``queue`` as the app would (durable, its arguments), once per connection."""
        def step() -> None:
            if queue not in self._declared:
                compass = getattr(self.app, "compass", None)
                if compass is not None:
                    compass.priority_queues()
                self.app.amqp.queues[queue](self._chan()).declare()
                self._declared.add(queue)
        self._guarded(step)

    # -- the drain -------------------------------------------------------------------------
    def stage(self, queues: Iterable[str], lease_timeout_s: float = 0.0,
              with_unacked: bool = True, in_flight_only: bool = False
              ) -> dict[str, tuple[int, int]]:
        """Take what waits in each queue now (the drain gets no more than that, so a
        message re-placed onto the same queue is not drained again in this round);
        -> {queue: (waiting, consumers still attached)}. Nothing moves yet. RabbitMQ
        returns a lost consumer's unacked messages itself: ``in_flight_only`` takes none."""
        out = {}
        for queue in queues if not in_flight_only else ():
            waiting, consumers = self.counts(queue)
            with self._lock:
                self._budget[(threading.get_ident(), queue)] = waiting
            out[queue] = (waiting, consumers)
        return out

    def next_staged(self, queue: str) -> bytes | None:
        """``basic.get`` the next message of ``queue`` and hold it unacked (an original
        already moved by a drainer that died before its ack is acked and skipped)."""
        me = (threading.get_ident(), queue)

        def step() -> bytes | None:
            held = self._taken.get(me)
            if held is not None:
                return held.raw
            while self._budget.get(me, 0) > 0:
                self._budget[me] -= 1
                channel = self._chan()
                msg = channel.basic_get(queue, no_ack=False)
                if msg is None:
                    break
                raw = envelope(msg)
                headers = (msg.properties or {}).get("application_headers")
                mark_id = _mark_id(headers)
                mark = _text(self.client.get(self.mark_key(mark_id))) if mark_id else None
                if mark == "moved":
                    channel.basic_ack(msg.delivery_tag)
                    self.skipped += 1
                    logger.warning("compass: %s was already moved from %s by a drain that "
                                   "stopped before its ack; acked, not sent again",
                                   mark_id, queue)
                    continue
                if mark == "moving":
                    logger.warning("compass: a drain stopped while moving %s from %s; "
                                   "sending it again (it runs twice if the broker had "
                                   "confirmed the first copy)", mark_id, queue)
                self._taken[me] = _Taken(msg.delivery_tag, raw,
                                         self.mark_key(mark_id) if mark_id else "")
                return raw
            self._budget.pop(me, None)
            return None
        return self._guarded(step)

    def target(self, queue: str, priority: Any) -> str:
        """AMQP keeps priorities inside one queue: the queue itself."""
        return queue

    def move(self, queue: str, expected: bytes, target: str, raw: str) -> bool:
        """Mark ``moving``, publish ``raw`` to ``target`` and wait for the broker's
        confirm, mark ``moved``, then ack the original. False when this drainer no
        longer holds ``expected`` (its connection was lost: the broker has it back)."""
        me = (threading.get_ident(), queue)

        def step() -> bool:
            held = self._taken.get(me)
            if held is None or held.raw != expected:
                return False
            import amqp

            message = json.loads(raw)
            headers = dict(message.get("headers") or {})
            headers[COPY_HEADER] = uuid.uuid4().hex
            props = {k: v for k, v in (message.get("properties") or {}).items()
                     if k in KEPT_PROPERTIES and v is not None}
            props["delivery_mode"] = 2  # persistent, as Celery sends it
            body = base64.b64decode(message.get("body") or "")
            if held.mark:
                self.client.set(held.mark, "moving", ex=MOVE_TTL_S)
            self.declare(target)
            channel = self._chan()
            channel.basic_publish_confirm(
                amqp.Message(body, content_type=message.get("content-type"),
                             content_encoding=message.get("content-encoding"),
                             application_headers=headers, **props),
                exchange="", routing_key=target, confirm_timeout=CONFIRM_TIMEOUT_S)
            if held.mark:
                self.client.set(held.mark, "moved", ex=MOVE_TTL_S)
            channel.basic_ack(held.tag)
            del self._taken[me]
            return True
        return self._guarded(step)

    def dead_letter(self, queue: str, expected: bytes, reason: str) -> bool:
        """Keep an unusable message in the Redis dead-letter list, then ack it."""
        me = (threading.get_ident(), queue)

        def step() -> bool:
            held = self._taken.get(me)
            if held is None or held.raw != expected:
                return False
            self.client.lpush(self.dead_letter_key, dead_entry(queue, expected, reason))
            self._chan().basic_ack(held.tag)
            del self._taken[me]
            return True
        return self._guarded(step)

    def dead_letter_raw(self, queue: str, raw: bytes | str, reason: str) -> None:
        """Keep an unusable message a consumer already took, with why."""
        self.client.lpush(self.dead_letter_key, dead_entry(queue, raw, reason))

    # -- what the worker and recovery ask ----------------------------------------------------
    def has_work(self, queue: str) -> bool:
        """Whether ``queue`` has a waiting message, or a consumer that may hold one."""
        waiting, consumers = self.counts(queue)
        return waiting > 0 or consumers > 0

    def waiting(self, queue: str) -> int:
        """How many messages wait in ``queue`` (``message_count``; unacked not counted)."""
        return self.counts(queue)[0]

    def peek(self, queue: str, limit: int = -1) -> list[bytes]:
        """Nothing: AMQP cannot read a queue without consuming it."""
        return []

    def guard_consumer(self, on_garbage: Callable[[str, str], None]) -> None:
        """Nothing to patch: Celery's AMQP consumer logs and acks undecodable bodies."""

    def fetch_atomically(self, queue: str) -> None:
        """Nothing to patch: RabbitMQ delivers into its own unacked state, with no window."""

    def hold_slot(self, queue: str, worker: str, bound_ms: float) -> None:
        """Nothing: a RabbitMQ consumer cannot skip a lower level's message (no held
        slot on this broker)."""

    def claim(self, queue: str, task: str, model: str | None, limit: int,
              host_now: float) -> list[bytes]:
        """RabbitMQ hands a consumer messages in order and cannot take them by content,
        so a batched task runs as a batch of one here."""
        return []

    def wait_for_arrival(self, queue: str, timeout_s: float) -> bool:
        """Nothing to watch without peeking; no batch holds here (:meth:`claim` takes
        none), so this only waits ``timeout_s`` out."""
        if timeout_s > 0:
            threading.Event().wait(timeout_s)
        return False

    def ack(self, tags: Iterable[str]) -> None:
        """Nothing was claimed (:meth:`claim`), so nothing to ack."""

    def renew_leases(self, tags: Iterable[str], host_now: float) -> list[str]:
        """No leases over AMQP: the broker holds unacked messages for their connection."""
        return list(tags)

    def prune_leases(self, older_than_s: float) -> int:
        """No leases over AMQP."""
        return 0

    def drop_leases(self, tags: Iterable[str]) -> int:
        """No leases over AMQP."""
        return 0

    def age(self, queue: str, now: float, age_s: float) -> int:
        """Nothing: RabbitMQ cannot move a waiting message within its queue."""
        return 0

    def delete(self, queue: str) -> None:
        """Delete ``queue`` and its messages (the benchmark's fresh start)."""
        self._guarded(lambda: self._chan().queue_delete(queue))

    def close(self) -> None:
        """Close this process's connection (what it held goes back to its queues)."""
        with self._lock:
            self._reset()
