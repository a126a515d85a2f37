"""kombu's Redis transport as compass must see it: lists, priorities, in-flight work.

Compass owns per-worker queues, so it must find every message of one: kombu
keeps a queue as one list per priority step (``<queue>\\x06\\x16<step>``), puts
a consumed-but-unacked message in its ``unacked`` hash (``[message, exchange,
routing_key]``) and may prefix every key (``global_keyprefix``). Those details
live here and nowhere else. :class:`RedisQueues` runs the atomic steps that
recovery and the worker's hand-back are built from; :class:`BrokerQueues` names
those steps, which :class:`~compass_celery.broker.amqp.AmqpQueues` implements
for RabbitMQ.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..planner.priority import aged, broker_priority
from ..state import keys
from ..state.connection import text
from ..state.scripts import register_script
from .fetch import BELL_TTL_MS, bell_name, hold_slot, install_atomic_fetch

#: Longest a watch's BLMOVE blocks server-side: under the client's socket timeout (compass
#: uses 2 s), so a watch never reads as a dead connection; a longer wait blocks again.
WATCH_BLOCK_S = 1.0

logger = logging.getLogger("compass_celery.broker")

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

    def bell(self, queue: str) -> str:
        """The bell of ``queue``: a token per message pushed onto any of its lists, which
        an idle consumer blocks on (:mod:`compass_celery.broker.fetch`)."""
        return self.keyprefix + bell_name(queue, self.sep)

    def bell_of(self, name: str) -> str:
        """The bell of the queue that list ``name`` (one of :meth:`lists`) belongs to."""
        name = name[len(self.keyprefix):] if name.startswith(self.keyprefix) else name
        return self.bell(name.split(self.sep, 1)[0])


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


def guard_undecodable(on_garbage: Callable[[str, str], None]) -> None:
    """Make kombu's Redis consumer survive a non-JSON entry in a queue it reads.

    kombu decodes an entry right after BRPOP took it; a decode error escapes its
    consumer loop, kills the worker and loses the entry, a JSON scalar kills it
    too (kombu's Message indexes it), and a JSON object that is not a kombu message
    is dropped as if the connection had failed. With this
    guard, such an entry goes to ``on_garbage(raw, why)`` and the read counts as
    empty: the worker keeps consuming. Lists (kombu's unacked entries) pass.
    Installed by the compass worker step (idempotent).
    """
    import kombu.transport.redis as kredis

    original = kredis.loads
    if getattr(original, "compass_guard", False):
        return

    def loads(s: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            value = original(s, *args, **kwargs)
        except (ValueError, TypeError) as exc:
            on_garbage(s if isinstance(s, str) else repr(s), f"not JSON ({exc})")
            raise kredis.Empty() from None
        if isinstance(value, dict) and not (isinstance(value.get("properties"), dict)
                                            and "delivery_tag" in value["properties"]):
            # kombu would fail on it as if the connection were lost, and drop it
            on_garbage(s, "not a kombu message (no properties.delivery_tag)")
            raise kredis.Empty()
        if not isinstance(value, (dict, list)):
            # a JSON scalar (a bell's token "1", a stray string): kombu's Message would
            # raise a TypeError that escapes the consumer and stops the worker, which
            # hands its queue to the shared one and leaves nobody to consume that
            on_garbage(s if isinstance(s, str) else repr(s),
                       f"not a kombu message (a JSON {type(value).__name__})")
            raise kredis.Empty()
        return value

    loads.compass_guard = True  # type: ignore[attr-defined]
    kredis.loads = loads


def peek(client: Any, layout: RedisLayout, queue: str, limit: int = -1) -> list[bytes]:
    """The next ``limit`` raw messages of ``queue`` (all when -1), next first, in the
    order kombu will deliver them (its priority lists included).

    kombu LPUSHes and BRPOPs, so a list's next message is its right end.
    """
    pipe = client.pipeline(transaction=False)
    for name in layout.lists(queue):
        pipe.lrange(name, -limit if limit > 0 else 0, -1)
    out: list[bytes] = []
    for raw in pipe.execute():
        out.extend(reversed(raw))
    return out[:limit] if limit > 0 else out


class BrokerQueues(Protocol):
    """The broker-queue steps that hand-back, recovery and the worker are built from.

    A drain is ``stage`` (what to take), then ``next_staged`` / ``move`` or
    ``dead_letter`` one message at a time: a message leaves its queue only once
    its copy is safely in its new queue (or in the dead-letter list).
    """

    #: True when the broker itself returns a lost consumer's unacked messages to their
    #: queue (AMQP): compass then keeps no leases and a restart has nothing to take back.
    returns_unacked: bool
    #: True when waiting messages can be read without consuming them (Redis lists).
    peekable: bool

    @property
    def dead_letter_key(self) -> str:
        """The Redis list of unusable messages, each with its queue and the reason."""

    def stage(self, queues: Iterable[str], lease_timeout_s: float,
              with_unacked: bool = True, in_flight_only: bool = False
              ) -> dict[str, tuple[int, int]]:
        """Take each queue's messages for a drain; -> {queue: (taken, still in flight)}.
        ``in_flight_only``: only in-flight messages whose lease lapsed (a shared queue)."""

    def next_staged(self, queue: str) -> bytes | None:
        """The next taken message of ``queue`` to re-place (None when done)."""

    def target(self, queue: str, priority: Any) -> str:
        """Where a message of ``priority`` bound for ``queue`` is put."""

    def move(self, queue: str, expected: bytes, target: str, raw: str) -> bool:
        """Put ``raw`` on ``target`` in place of ``expected``; False when already gone."""

    def dead_letter(self, queue: str, expected: bytes, reason: str) -> bool:
        """Move an unusable taken message to the dead-letter list, with why."""

    def dead_letter_raw(self, queue: str, raw: bytes | str, reason: str) -> None:
        """Keep an unusable message a consumer already took, with why."""

    def has_work(self, queue: str) -> bool:
        """Whether ``queue`` still holds (or may get back) a message."""

    def waiting(self, queue: str) -> int:
        """How many messages wait in ``queue`` (in-flight ones not counted)."""

    def peek(self, queue: str, limit: int = -1) -> list[bytes]:
        """The next waiting raw messages, next first ([] where the broker cannot peek)."""

    def guard_consumer(self, on_garbage: Callable[[str, str], None]) -> None:
        """Make this process's consumer keep an undecodable message instead of dying."""

    def fetch_atomically(self, queue: str) -> None:
        """Make this process's consumer of ``queue`` take each message into flight in one
        step, so none is lost to a kill between taking and recording it."""

    def hold_slot(self, queue: str, worker: str, bound_ms: float) -> None:
        """Make this process's consumer of ``queue`` (``worker``'s own) hold its slot for a
        higher level's planned successor, for at most ``bound_ms`` real ms per hold
        (``worker.core.slot_held_until``); nothing where the broker cannot."""

    def claim(self, queue: str, task: str, model: str | None, limit: int,
              host_now: float) -> list[bytes]:
        """Take up to ``limit`` waiting messages of ``task`` (and ``model``) off
        ``queue``, in flight as if consumed: a batch's other members ([] where the broker
        cannot take messages by content: each runs as a batch of one)."""

    def wait_for_arrival(self, queue: str, timeout_s: float) -> bool:
        """Block until a message is in ``queue`` or ``timeout_s`` passes, consuming
        nothing; -> whether one is there. A forming batch holds open with it."""

    def ack(self, tags: Iterable[str]) -> None:
        """Ack messages taken by :meth:`claim`."""

    def renew_leases(self, tags: Iterable[str], host_now: float) -> list[str]:
        """Renew running tasks' leases; -> the tags no longer in flight."""

    def prune_leases(self, older_than_s: float) -> int:
        """Forget leases not renewed for ``older_than_s``."""

    def drop_leases(self, tags: Iterable[str]) -> int:
        """Forget the leases of ended tasks."""

    def age(self, queue: str, now: float, age_s: float) -> int:
        """Apply the ageing rule to ``queue``'s waiting messages; -> how many moved up."""


class RedisQueues:
    """Atomic operations on compass queues in the broker's Redis.

    Recovery and hand-back never hold a message only in memory: a queue's
    messages (and its owner's unleased in-flight ones) are first moved into a
    staging list in one script; each is then moved from staging to its new
    queue, or to the dead-letter list, in another script that checks it is still
    the one read. A drainer killed at any point leaves every message in a queue
    or in staging, where the next drainer resumes.
    """

    returns_unacked = False  # kombu's unacked hash waits for the visibility timeout
    peekable = True

    def __init__(self, client: Any, layout: RedisLayout, prefix: str) -> None:
        self.client, self.layout, self.prefix = client, layout, prefix
        self._stage = register_script(client, "stage")
        self._move = register_script(client, "move")
        self._lease = register_script(client, "lease")
        self._promote = register_script(client, "promote")
        self._claim = register_script(client, "inflight", "claim")

    def staging_key(self, queue: str) -> str:
        """The staging list of messages taken from ``queue`` and not yet re-placed."""
        return keys.key(keys.STAGING, self.prefix, queue=queue)

    @property
    def dead_letter_key(self) -> str:
        """The list of unusable messages, each with its queue and the reason."""
        return keys.key(keys.DEAD_LETTER, self.prefix)

    def fetch_atomically(self, queue: str) -> None:
        """Make this process's consumer of ``queue`` take each message atomically into
        flight (:func:`install_atomic_fetch`)."""
        install_atomic_fetch(queue, self.leases_key)

    def hold_slot(self, queue: str, worker: str, bound_ms: float) -> None:
        """Make this process's atomic fetch of ``queue`` hold its slot (fetch.lua): no
        message below the highest level planned on ``worker`` (the state's pending-queued
        counts, read in this Redis: the state must live here) for at most ``bound_ms``
        real ms per hold (:func:`hold_slot`)."""
        hold_slot(queue, keys.key(keys.PENDING_QUEUED, self.prefix),
                  keys.queued_member(worker, 0)[:-1],
                  keys.key(keys.HELD_SLOT, self.prefix, queue=queue), bound_ms)

    @property
    def leases_key(self) -> str:
        """The sorted set of delivery tags by the Redis time their runner last renewed."""
        return keys.key(keys.LEASES, self.prefix)

    def peek(self, queue: str, limit: int = -1) -> list[bytes]:
        """The next ``limit`` raw messages of ``queue`` (all when -1), in delivery order."""
        return peek(self.client, self.layout, queue, limit)

    def stage(self, queues: Iterable[str], lease_timeout_s: float,
              with_unacked: bool = True, in_flight_only: bool = False
              ) -> dict[str, tuple[int, int]]:
        """Move each queue's waiting messages, and its in-flight
        ones whose lease has lapsed, into its staging list; -> {queue: (staged now, in
        flight and leased)}. ``in_flight_only`` (a queue live workers share): no waiting
        message, and only in-flight ones whose lease lapsed (an unleased one is not known
        to be a dead worker's: kombu's visibility timeout returns it)."""
        queues = list(queues)
        if not queues:
            return {}
        lists = [[] if in_flight_only else self.layout.lists(q)
                 for q in queues]
        keys_ = [self.layout.keyprefix + self.layout.unacked,
                 self.layout.keyprefix + self.layout.unacked_index, self.leases_key]
        argv: list[Any] = [lease_timeout_s, 1 if with_unacked else 0, len(queues)]
        for q, ls in zip(queues, lists, strict=True):
            keys_.append(self.staging_key(q))
            keys_.extend(ls)
            argv.extend([q, len(ls), 1 if in_flight_only else 0])
        counts = self._stage(keys=keys_, args=argv)
        return {q: (int(counts[2 * i]), int(counts[2 * i + 1])) for i, q in enumerate(queues)}

    def next_staged(self, queue: str) -> bytes | None:
        """The staged message to re-place next (it stays staged until moved)."""
        return self.client.lindex(self.staging_key(queue), -1)

    def target(self, queue: str, priority: Any) -> str:
        """The list of ``queue`` a message of ``priority`` is pushed to."""
        return self.layout.list_for(queue, priority)

    def guard_consumer(self, on_garbage: Callable[[str, str], None]) -> None:
        """Keep kombu's Redis consumer alive on garbage (:func:`guard_undecodable`)."""
        guard_undecodable(on_garbage)

    def waiting(self, queue: str) -> int:
        """Messages waiting in ``queue``'s lists (priority lists included)."""
        pipe = self.client.pipeline(transaction=False)
        for name in self.layout.lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())

    def move(self, queue: str, expected: bytes, target_list: str, raw: str) -> bool:
        """Atomically pop ``expected`` off ``queue``'s staging and push ``raw`` onto
        ``target_list`` (one of a queue's lists), ringing that queue's bell; False (and
        nothing done) when another drainer moved it first."""
        return bool(self._move(keys=[self.staging_key(queue), target_list,
                                     self.layout.bell_of(target_list)],
                               args=[expected, raw, BELL_TTL_MS]))

    def dead_letter(self, queue: str, expected: bytes, reason: str) -> bool:
        """Move an unusable staged entry to the dead-letter list, with why."""
        return bool(self._move(keys=[self.staging_key(queue), self.dead_letter_key],
                               args=[expected, dead_entry(queue, expected, reason)]))

    def dead_letter_raw(self, queue: str, raw: bytes | str, reason: str) -> None:
        """Keep an unusable message a consumer already took, with why."""
        self.client.lpush(self.dead_letter_key, dead_entry(queue, raw, reason))

    def has_work(self, queue: str) -> bool:
        """Whether ``queue`` has a message in any of its lists or in staging."""
        pipe = self.client.pipeline(transaction=False)
        for name in [*self.layout.lists(queue), self.staging_key(queue)]:
            pipe.llen(name)
        return any(pipe.execute())

    def claim(self, queue: str, task: str, model: str | None, limit: int,
              host_now: float, scan: int = 256) -> list[bytes]:
        """Take up to ``limit`` waiting messages of ``task`` (and ``model``) off ``queue``
        into kombu's unacked hash, leased, in one step (claim.lua): a batch's other
        members, in flight as if consumed; -> their raw messages, oldest first."""
        if limit <= 0:
            return []
        return list(self._claim(
            keys=[self.layout.keyprefix + self.layout.unacked,
                  self.layout.keyprefix + self.layout.unacked_index, self.leases_key,
                  *self.layout.lists(queue)],
            args=[task, model or "", limit, host_now, scan]))

    def wait_for_arrival(self, queue: str, timeout_s: float) -> bool:
        """Block until a message is in any of ``queue``'s lists or ``timeout_s`` passes,
        consuming nothing; -> whether one arrived. A forming batch holds open with it:
        its lists are empty then (anything else waiting ends the hold), so the first
        push wakes it, a member to claim or other work to start the batch for.
        Raises RedisError or OSError when the watch cannot be set (Redis < 6.2: no
        BLMOVE)."""
        if timeout_s <= 0:
            return False
        return ListWatch(self.client, self.layout.lists(queue)).wait(timeout_s)

    def ack(self, tags: Iterable[str]) -> None:
        """Ack claimed messages as kombu acks one (off its unacked hash and index)."""
        tags = list(tags)
        if tags:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(self.layout.keyprefix + self.layout.unacked_index, *tags)
            pipe.hdel(self.layout.keyprefix + self.layout.unacked, *tags)
            pipe.execute()

    def renew_leases(self, tags: Iterable[str], host_now: float) -> list[str]:
        """Keep running tasks' in-flight entries theirs: our lease on Redis's clock,
        and kombu's visibility-timeout index (host clock: kombu compares with it).
        Returns the tags that are no longer in flight (acked), to forget."""
        tags = list(tags)
        if not tags:
            return []
        gone = self._lease(keys=[self.leases_key,
                                 self.layout.keyprefix + self.layout.unacked_index,
                                 self.layout.keyprefix + self.layout.unacked],
                           args=[host_now, *tags])
        return [text(g) for g in gone]

    def prune_leases(self, older_than_s: float) -> int:
        """Forget leases not renewed for ``older_than_s`` (on Redis's clock)."""
        now = redis_time(self.client)
        return int(self.client.zremrangebyscore(self.leases_key, "-inf", now - older_than_s))

    def drop_leases(self, tags: Iterable[str]) -> int:
        """Delete ended tasks' leases (one ZREM): none outlives its task."""
        tags = list(tags)
        return int(self.client.zrem(self.leases_key, *tags)) if tags else 0

    def age(self, queue: str, now: float, age_s: float, limit: int = 100) -> int:
        """The ageing rule, so low-priority work is never starved: each message that has
        waited (since ``queued_at`` in its compass header, the sender's clock) long enough
        to climb a level (:func:`~compass_celery.planner.priority.aged`) moves to that
        level's list, where it is served next. The ``limit`` oldest of each lower list
        are looked at; -> how many moved."""
        if age_s <= 0:
            return 0
        moved = 0
        for name in self.layout.lists(queue)[1:]:  # the highest list has nowhere to go
            for raw in reversed(self.client.lrange(name, -limit, -1)):  # oldest first
                placed = message_headers(raw).get("compass")
                if not isinstance(placed, dict) or placed.get("priority") is None:
                    continue
                try:
                    level = int(placed["priority"])
                    waited = now - float(placed.get("queued_at") or now)
                except (TypeError, ValueError):
                    continue
                target = self.layout.list_for(
                    queue, broker_priority(aged(level, waited, age_s), redis=True))
                if target != name and self._promote(keys=[name, target, self.layout.bell(queue)],
                                                    args=[raw, BELL_TTL_MS]):
                    moved += 1
        return moved


class ListWatch:
    """Blocks until any of several lists holds a message, without popping it.

    No Redis command blocks on several lists without popping, so each list gets a BLMOVE
    of itself onto its own right end (a message that arrives stays where it was, in
    order), on its own connection, read by its own thread; the first to return wakes
    the caller. The wait's end is timed here, not by Redis, which ends a blocking
    command only on its ``hz`` tick (100 ms by default, far past a batch's few ms):
    CLIENT UNBLOCK then ends every watch still blocked, freeing its connection."""

    def __init__(self, client: Any, lists: list[str], block_s: float = WATCH_BLOCK_S) -> None:
        self.client, self.lists, self.block_s = client, lists, block_s
        self.woke = threading.Event()
        self.arrived = False
        self.error: BaseException | None = None

    def wait(self, timeout_s: float) -> bool:
        """Watch every list for at most ``timeout_s``; -> whether a message arrived
        (False also when a watch timed out on Redis's side first: wait again)."""
        pool, conns = self.client.connection_pool, []
        try:
            for name in self.lists:
                conn = _connection(pool)
                conns.append(conn)
                conn.send_packed_command(conn.pack_commands(
                    [("CLIENT", "ID"), ("BLMOVE", name, name, "RIGHT", "RIGHT", self.block_s)]))
            ids = [conn.read_response() for conn in conns]  # each BLMOVE now blocks
        except BaseException:
            for conn in conns:
                conn.disconnect()
                pool.release(conn)
            raise
        for conn in conns:
            threading.Thread(target=self._read, args=(pool, conn), daemon=True,
                             name="compass-list-watch").start()
        self.woke.wait(timeout_s)
        self._unblock(ids)
        if self.error is not None and not self.arrived:
            raise self.error
        return self.arrived

    def _read(self, pool: Any, conn: Any) -> None:
        """One watch's reply: a message (it arrived), nil (timed out or unblocked)."""
        try:
            if conn.read_response() is not None:
                self.arrived = True
        except BaseException as exc:  # a dead connection: the caller hears of it
            self.error = exc
            conn.disconnect()
        finally:
            pool.release(conn)
            self.woke.set()

    def _unblock(self, ids: list[Any]) -> None:
        """End the watches still blocked; one that cannot be ends within ``block_s``."""
        from redis.exceptions import RedisError

        try:
            pipe = self.client.pipeline(transaction=False)
            for client_id in ids:
                pipe.client_unblock(int(client_id))
            pipe.execute()
        except (RedisError, OSError, ValueError):
            pass


def _connection(pool: Any) -> Any:
    """A connection of its own from ``pool`` (redis-py 5.3+ takes no command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("BLMOVE")


def dead_entry(queue: str, raw: bytes | str, reason: str) -> str:
    """A dead-letter list entry (JSON): where it came from, why, and the raw message."""
    return json.dumps({"queue": queue, "reason": reason, "raw": text(raw)})


def redis_time(client: Any) -> float:
    """Redis's own clock, in seconds: the one clock liveness is judged by."""
    sec, usec = client.time()
    return float(sec) + float(usec) / 1e6
