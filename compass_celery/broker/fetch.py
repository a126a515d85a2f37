"""The atomic fetch: kombu's Redis consumer of compass queues, without its fetch window.

kombu's Redis transport takes a message with BRPOP and only then writes its unacked entry;
a worker killed in between loses the message. Here a compass worker's channel takes each
message into flight (kombu's unacked hash and index, with a compass lease) in one Lua step.

No Redis command blocks on several lists and moves what arrives, so an idle consumer
blocks on **bells** instead: each compass queue has one list (``<queue><sep>bell``,
beside its priority lists) that gets a token with every message pushed onto any list of
the queue, in the same transaction or script as the push (kombu's ``_put`` and restore,
compass's re-placement and ageing). A token is only a wake-up: the worker that pops one
runs the fetch script, which takes the highest-priority message, and the script clears
the bells whenever it finds every list empty. A token lost (a producer that does not
ring) costs at most kombu's own BRPOP timeout; a stale one, an empty look.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..planner.priority import HIGHEST, PLANNED_EPS_MS
from ..state.keys import JOB_HEADER
from ..state.scripts import script

#: Bells expire this long after their last token: a token matters only while a consumer
#: is about to block or blocked (a busy one looks at every list after each task), so
#: this only bounds what a queue nobody idles on keeps (a token per message pushed).
BELL_TTL_MS = 10_000
#: The bell's name beside a queue's priority lists (``<queue><sep>bell``).
BELL = "bell"

logger = logging.getLogger("compass_celery.broker")

_FETCH: dict[str, str] = {}  # own queue consumed atomically -> the leases zset
#: own queue -> its held slot: (the pending-queued hash, the worker's member prefix, the
#: hold key, the bound in real ms)
_HOLD: dict[str, tuple[str, str, str, float]] = {}
#: own queue -> what fetch.lua needs to read a job node's job state as it takes the node:
#: (the job header's name, what goes before and after a job id in its record's key)
_JOB_STATE: dict[str, tuple[str, str, str]] = {}
#: delivery tag -> the job state fetch.lua read with the message, while it is delivered
_fetched_states: dict[str, str] = {}
#: What fetch.lua returns in a list's place when it holds the slot.
HELD = b"\0held"
_RINGING: set[tuple[str, str]] = set()  # (queue prefix, shared queue) of compass apps
_RINGS: dict[str, bool] = {}  # queue -> whether it rings (memo of _RINGING)


# -- bells: every push onto a compass queue wakes an idle consumer ---------------------------
def bell_name(queue: str, sep: str) -> str:
    """The bell of ``queue`` (without kombu's ``global_keyprefix``)."""
    return f"{queue}{sep}{BELL}"


def rings(queue: str) -> bool:
    """Whether pushes onto ``queue`` ring its bell: a compass queue (a worker's own, by
    its prefix, or the shared one) of an app this process set up."""
    known = _RINGS.get(queue)
    if known is None:
        known = _RINGS[queue] = any(queue.startswith(prefix) or queue == shared
                                    for prefix, shared in _RINGING)
    return known


def ring_compass_queues(queue_prefix: str, shared_queue: str) -> None:
    """Make every kombu Redis publish (and restore) onto a compass queue named by
    ``queue_prefix`` or ``shared_queue`` ring the queue's bell in the same step (push.lua).
    Called wherever a compass app's settings are read (producers and workers alike);
    idempotent."""
    import kombu.transport.redis as kredis

    if (queue_prefix, shared_queue) not in _RINGING:
        _RINGING.add((queue_prefix, shared_queue))
        _RINGS.clear()
    channel = kredis.Channel
    if getattr(channel._put, "compass_bell", False):
        return
    put, restore = channel._put, channel._do_restore_message

    def _put(self: Any, queue: str, message: Any, **kwargs: Any) -> Any:
        if not rings(queue):
            return put(self, queue, message, **kwargs)
        return _put_ringing(self, put, queue, message, **kwargs)

    def _do_restore_message(self: Any, payload: Any, exchange: Any, routing_key: Any,
                            pipe: Any, leftmost: bool = False) -> None:
        restore(self, payload, exchange, routing_key, pipe, leftmost)
        with contextlib.suppress(Exception):  # kombu logs what it could not restore
            for queue in self._lookup(exchange, routing_key):
                if rings(queue):
                    ring(pipe, bell_name(queue, self.sep))

    _put.compass_bell = True  # type: ignore[attr-defined]
    channel._put, channel._do_restore_message = _put, _do_restore_message


class _Commands:
    """Stands in for kombu's publish batch: collects the commands its ``_put`` sends."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple[Any, ...]]] = []

    def add(self, name: str, *args: Any) -> None:
        """Keep one command kombu would send."""
        self.commands.append((name, args))


def _put_ringing(channel: Any, put: Any, queue: str, message: Any, **kwargs: Any) -> None:
    """kombu's ``_put`` of ``message`` onto ``queue`` and a token on its bell, in one step:
    push.lua by EVALSHA (in kombu's publish batch when it sends one, as kombu's own
    commands; in a MULTI/EXEC when kombu's push is not the one push.lua knows)."""
    bell = bell_name(queue, channel.sep)
    batch = kwargs.get("_publish_batch")
    if batch is not None:
        put(channel, queue, message, **kwargs)
        ring(batch, bell, add=True)
        return
    commands = _Commands()
    put(channel, queue, message, **{**kwargs, "_publish_batch": commands})
    push = _as_push(commands.commands)
    if push is not None:
        pre = channel.global_keyprefix or ""
        key, body, expiring, expiry = push
        front = [JOB_HEADER, FRONT_SCAN] if is_later_step(message) else []
        keys = [pre + key, pre + bell, *(pre + k for k in expiring)]
        args = [body, BELL_TTL_MS, expiry if expiring else "", *front]
        held = getattr(_held, "pushes", None)
        if held is not None and not pre:  # sent with the others (held_pushes)
            held.pushes.append((channel, keys, args))
            return
        with channel.conn_or_acquire() as client:
            run_script(client, "push", keys, args)
        return
    with channel.conn_or_acquire() as client, client.pipeline() as pipe:
        for name, args in commands.commands:  # none on a kombu without publish batches:
            getattr(pipe, name)(*args)        # its _put pushed, the bell rings after
        ring(pipe, bell)
        pipe.execute()


#: This thread's held pushes (:func:`held_pushes`); None: none held.
_held = threading.local()


class HeldPushes:
    """Pushes onto compass queues (push.lua's keys and arguments, with their channel)
    held by :func:`held_pushes` until :meth:`send`."""

    def __init__(self) -> None:
        self.pushes: list[tuple[Any, list[str], list[Any]]] = []

    def send(self) -> None:
        """Send what is held: one pipeline per channel (each push still one script, as
        alone). A send that fails raises, with any push of the pipeline possibly done."""
        pushes, self.pushes = self.pushes, []
        _send_held(pushes)


@contextlib.contextmanager
def held_pushes() -> Iterator[HeldPushes]:
    """Within the block, this thread's pushes onto compass queues are held, to be sent
    together (:meth:`HeldPushes.send`; at the block's end, what is still held): a worker
    sending several successors of one node waits for one round trip, not one a
    successor. Pushes of a channel with a ``global_keyprefix`` are not held. Nested
    blocks are one (the outermost sends)."""
    outer = getattr(_held, "pushes", None)
    if outer is not None:
        yield outer
        return
    held = _held.pushes = HeldPushes()
    try:
        yield held
    finally:
        _held.pushes = None
        held.send()


def _send_held(held: list[tuple[Any, list[str], list[Any]]]) -> None:
    """Run held pushes (:func:`held_pushes`) by EVALSHA, one pipeline per channel; one
    Redis did not know runs whole (EVAL, which loads it)."""
    from redis.exceptions import NoScriptError

    channels: dict[int, tuple[Any, list[tuple[list[str], list[Any]]]]] = {}
    for channel, keys, args in held:
        channels.setdefault(id(channel), (channel, []))[1].append((keys, args))
    for channel, pushes in channels.values():
        with channel.conn_or_acquire() as client:
            if len(pushes) == 1:
                run_script(client, "push", *pushes[0])
                continue
            with client.pipeline(transaction=False) as pipe:
                for keys, args in pushes:
                    pipe.execute_command("EVALSHA", _sha("push"), len(keys), *keys, *args)
                replies = pipe.execute(raise_on_error=False)
            for (keys, args), reply in zip(pushes, replies, strict=True):
                if isinstance(reply, NoScriptError):  # nothing ran: sent whole
                    client.execute_command("EVAL", _source("push"), len(keys), *keys, *args)
                elif isinstance(reply, Exception):
                    raise reply


#: How many waiting entries, from a list's front, a later step's push reads at most (only
#: urgent later steps sit there: few).
FRONT_SCAN = 32


def is_later_step(message: Any) -> bool:
    """Whether a kombu message is a later step of a job with a deadline (its job header
    says so): push.lua puts it in its priority list ahead of the first steps waiting
    there (``worker.core``'s rule). A push kombu sends in another shape (the
    transaction below) keeps kombu's order."""
    headers = message.get("headers") if isinstance(message, dict) else None
    job = headers.get(JOB_HEADER) if isinstance(headers, dict) else None
    return isinstance(job, dict) and job.get("later") is True


def _as_push(commands: list[tuple[str, tuple[Any, ...]]]
             ) -> tuple[str, Any, list[str], Any] | None:
    """kombu's commands for one message as push.lua's (list, message, lists to expire,
    their expiry): one LPUSH, then PEXPIREs of one expiry; None for anything else."""
    if not commands or commands[0][0] != "lpush" or len(commands[0][1]) != 2:
        return None
    (key, body), rest = commands[0][1], commands[1:]
    if any(name != "pexpire" or len(args) != 2 for name, args in rest):
        return None
    expiries = {args[1] for _, args in rest}
    if len(expiries) > 1:
        return None
    return key, body, [args[0] for _, args in rest], next(iter(expiries), None)


@functools.cache
def _sha(name: str) -> str:
    """The SHA1 Redis knows script ``name`` by (EVALSHA)."""
    return hashlib.sha1(_source(name).encode()).hexdigest()


def _source(name: str) -> str:
    """A script's whole source: fetch.lua with inflight.lua's helper in front."""
    return script("inflight") + script("fetch") if name == "fetch" else script(name)


def run_script(client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
    """Run script ``name`` on ``client`` by EVALSHA, sending it whole (EVAL, which also
    loads it) only when Redis does not have it (NOSCRIPT: nothing ran). ``keys`` are
    passed as given: a kombu client with a ``global_keyprefix`` would prefix only the
    first, so its prefixing is stepped over (the caller prefixes them all)."""
    from redis import Redis
    from redis.exceptions import NoScriptError

    execute = functools.partial(Redis.execute_command, client) \
        if getattr(client, "global_keyprefix", None) else client.execute_command
    try:
        return execute("EVALSHA", _sha(name), len(keys), *keys, *args)
    except NoScriptError:
        return execute("EVAL", _source(name), len(keys), *keys, *args)


def ring(pipe: Any, bell: str, add: bool = False) -> None:
    """Queue a token on ``bell`` (and its expiry) on ``pipe`` (a kombu batch: ``add``)."""
    if add:
        pipe.add("lpush", bell, "1")
        pipe.add("pexpire", bell, BELL_TTL_MS)
    else:
        pipe.lpush(bell, "1")
        pipe.pexpire(bell, BELL_TTL_MS)


# -- the consumer -----------------------------------------------------------------------------
def install_atomic_fetch(queue: str, leases_key: str) -> None:
    """Make this process's kombu Redis consumer of ``queue`` fetch atomically.

    kombu BRPOPs and then writes its unacked entry: a message Redis hands to a worker
    killed in between (or to a connection of a process already dead, before Redis saw
    it close) is in neither place, and nothing can find it. Here a channel consuming
    ``queue`` instead runs fetch.lua, which moves the next message (kombu's order:
    priority lists, then queues) into kombu's unacked hash and index with a compass
    lease, in one step. With nothing to take, it blocks in a BRPOP of its compass
    queues' bells (and of any other queue's lists, which kombu's BRPOP would read: those
    keep kombu's window), with the next look queued behind it on the same connection, so
    Redis looks as soon as a token arrives (or kombu's BRPOP timeout passes). When the
    wait popped another queue's message, a message the look took goes back to its list
    (unfetch.lua): the worker still holds one. The look queued behind a wait stamps
    kombu's index with the time it was sent, at most that timeout early.
    Acks, rejects, the visibility timeout and prefetch are kombu's own, unchanged. A
    Redis that refuses the script gets kombu's BRPOP back, with a warning. Installed
    by the compass worker (idempotent).
    """
    import kombu.transport.redis as kredis

    _FETCH[queue] = leases_key
    channel = kredis.Channel
    if getattr(channel._brpop_start, "compass_fetch", False):
        return
    start, read = channel._brpop_start, channel._brpop_read

    def _brpop_start(self: Any, timeout: Any = None) -> Any:
        own = _own_queue(self)
        if own is None:
            _send_acks(self)  # the atomic fetch is off: kombu's acks, kombu's BRPOP
            return start(self, timeout)
        return _fetch_start(self, own, timeout)

    def _brpop_read(self: Any, **options: Any) -> Any:
        if getattr(self, "_compass_cmd", None) is None:
            return read(self, **options)
        return _fetch_read(self, **options)

    _brpop_start.compass_fetch = True  # type: ignore[attr-defined]
    channel._brpop_start, channel._brpop_read = _brpop_start, _brpop_read
    _skip_taken_append(kredis.QoS)
    _defer_acks(kredis.QoS, kredis.Transport)
    _flush_acks_on_close(channel)


def _skip_taken_append(qos: Any) -> None:
    """kombu's consumer writes a delivered message's unacked entry and index score (a
    pipeline: one round trip between a task's fetch and its start); one fetch.lua took
    into flight already has both, so only kombu's own in-memory count of it is kept
    (the index keeps the look's stamp: at most kombu's BRPOP timeout early). A message
    kombu's BRPOP took (a queue that does not ring) is written as kombu writes it."""
    from kombu.transport import virtual

    if getattr(qos.append, "compass_fetch", False):
        return
    append = qos.append

    def _append(self: Any, message: Any, delivery_tag: Any) -> None:
        channel = self.channel
        if delivery_tag is not None and getattr(channel, "_compass_taken", None) == delivery_tag:
            channel._compass_taken = None
            virtual.QoS.append(self, message, delivery_tag)
            return
        append(self, message, delivery_tag)

    _append.compass_fetch = True  # type: ignore[attr-defined]
    qos.append = _append


def _defer_acks(qos: Any, transport: Any) -> None:
    """An ack made between the atomic fetch's delivery and the channel's next look, on an
    event loop (Celery's worker: the solo pool runs the task inside the delivery, its ack
    runs on the loop's next turn, then the loop sends the next look), is not sent on its
    own (kombu's MULTI/EXEC: one round trip between a task's end and the next look): it
    rides that look (fetch.lua acks first), or the channel's close. Until then the
    message stays in flight: a worker killed in between has it run again, as one killed
    just before kombu's ack did. kombu's in-memory count is settled at once (prefetch).
    Any other ack (after the next look was sent; a consumer without an event loop, which
    may not look again soon; a channel no longer consuming its compass queue) is
    kombu's, unchanged."""
    from kombu.transport import virtual

    if getattr(qos.ack, "compass_fetch", False):
        return
    ack, register = qos.ack, transport.register_with_event_loop

    def _register(self: Any, connection: Any, loop: Any) -> Any:
        self.cycle._compass_loop = True  # its channels look again on every turn
        return register(self, connection, loop)

    def _ack(self: Any, delivery_tag: Any) -> None:
        channel = self.channel
        if not getattr(channel, "_compass_ack_later", False) \
                or not isinstance(delivery_tag, str) or _own_queue(channel) is None:
            ack(self, delivery_tag)  # no look of the atomic fetch is coming
            return
        channel._compass_acks = [*getattr(channel, "_compass_acks", ()), delivery_tag]
        virtual.QoS.ack(self, delivery_tag)

    _ack.compass_fetch = True  # type: ignore[attr-defined]
    qos.ack, transport.register_with_event_loop = _ack, _register


def _take_acks(channel: Any) -> list[str]:
    """The acks waiting for the next look, now counted as sent with it (given back by
    :func:`_acks_back` when the look did not run)."""
    acks = getattr(channel, "_compass_acks", None) or []
    channel._compass_acks, channel._compass_ack_later = [], False
    channel._compass_sent_acks = acks
    return acks


def _acks_back(channel: Any) -> None:
    """The look that carried acks did not run (or its reply was lost): they wait for the
    next one (acking twice is harmless)."""
    sent = getattr(channel, "_compass_sent_acks", None)
    if sent:
        channel._compass_acks = [*sent, *(getattr(channel, "_compass_acks", None) or ())]
    channel._compass_sent_acks = []


def _send_acks(channel: Any) -> None:
    """Send the acks waiting for a look that will not come (the atomic fetch turned off,
    the channel closing) as kombu sends them (one MULTI/EXEC each)."""
    channel._compass_ack_later = False
    acks = getattr(channel, "_compass_acks", None)
    if not acks:
        return
    channel._compass_acks = []
    for tag in acks:
        channel.qos._remove_from_indices(tag).execute()


def _flush_acks_on_close(channel_cls: Any) -> None:
    """A closing channel first reads the look it has in flight (kombu's close does) and
    then sends the acks no look carried: a worker stopping after a task leaves its
    message acked, not in flight for recovery to run again."""
    if getattr(channel_cls.close, "compass_fetch", False):
        return
    close = channel_cls.close

    def _close(self: Any) -> None:
        if not self.closed:
            if self._in_poll and getattr(self, "_compass_cmd", None) is not None:
                with contextlib.suppress(Exception):  # kombu's close reads it so
                    self._brpop_read()
            try:
                _send_acks(self)
            except Exception as exc:  # Redis away: the lease lapses, recovery reruns
                logger.warning("compass: could not ack on close (%s)", exc)
        close(self)

    _close.compass_fetch = True  # type: ignore[attr-defined]
    channel_cls.close = _close


def hold_slot(queue: str, planned_key: str, member_prefix: str, hold_key: str,
              bound_ms: float) -> None:
    """Make this process's atomic fetch of ``queue`` hold its slot (``worker.core``'s
    ``slot_held_until``, in fetch.lua): it takes no message of a level below the highest
    level planned on this worker, unless its ``compass`` header carries a due time (only
    work without a deadline is held) (``planned_key``'s members ``member_prefix`` + level,
    the state's pending-queued counts, which must live in the broker's Redis), for at
    most ``bound_ms`` (real ms) per hold; ``bound_ms`` <= 0 turns it off."""
    if bound_ms > 0:
        _HOLD[queue] = (planned_key, member_prefix, hold_key, float(bound_ms))
    else:
        _HOLD.pop(queue, None)


def read_job_states(queue: str, header: str, job_key: str) -> None:
    """Make this process's atomic fetch of ``queue`` read each job node's job state in the
    step that takes it (the job's record must live in the broker's Redis): ``header``
    names the message header holding the node's job (``{"id": ...}``), ``job_key`` is a
    job record's key with ``\0`` in the id's place. The worker's receipt check then asks
    Redis nothing (:func:`fetched_job_state`). An empty ``header`` turns it off."""
    if header:
        head, _, tail = job_key.partition("\0")
        _JOB_STATE[queue] = (header, head, tail)
    else:
        _JOB_STATE.pop(queue, None)


def fetched_job_state(delivery_tag: Any) -> str | None:
    """The state of the job of the message being delivered under ``delivery_tag``, as the
    fetch that took it read it (``''``: its record is gone); None when the fetch did not
    read it (not a job node, not fetched atomically, or no longer being delivered)."""
    return _fetched_states.get(delivery_tag) if isinstance(delivery_tag, str) else None


def _is_held(src: Any) -> bool:
    """Whether a look's reply says the slot is held (:data:`HELD` in a list's place)."""
    return src == HELD or src == HELD.decode()


def _list_level(pri: int) -> int:
    """The highest level a message in kombu's list of priority step ``pri`` can have
    (``planner.priority.broker_priority``: Redis serves broker priority 0, level 9,
    first)."""
    return HIGHEST - int(pri)


def _own_queue(channel: Any) -> str | None:
    """The compass queue ``channel`` consumes atomically, None for kombu's own BRPOP."""
    if getattr(channel, "_compass_off", False):
        return None
    return next((q for q in _FETCH if q in channel.active_queues), None)


def _fetch_start(channel: Any, own: str, timeout: Any = None) -> None:
    """Send the next look (fetch.lua) or, after one found nothing, the blocking wait with
    the next look queued behind it: Redis runs that look as soon as the wait ends (a
    token, a message on another queue, or the timeout), so a wake costs no round trip."""
    queues = channel._queue_cycle.consume(len(channel.active_queues))
    if not queues:
        return
    pre = channel.global_keyprefix or ""
    conn = channel.client.connection
    channel._in_poll = conn
    channel._brpop_sent_at = time.monotonic()
    channel._compass_leases = _FETCH[own]
    bells = [pre + bell_name(q, channel.sep) for q in queues if rings(q)]
    lists = [pre + channel._q_for_pri(q, pri) for pri in channel.priority_steps for q in queues]
    # by EVALSHA: a NOSCRIPT reply (a Redis restarted or flushed) ran nothing, and the
    # next look sends the script whole (EVAL, which loads it)
    how = ("EVAL", _fetch_script()) if getattr(channel, "_compass_load", False) \
        else ("EVALSHA", _sha("fetch"))
    channel._compass_load = False
    held = _HOLD.get(own)
    extra_keys: tuple[str, ...] = ()
    extra: tuple[Any, ...] = ()
    if held is not None:
        planned, member, hold_key, bound = held
        extra_keys = (planned, hold_key, pre + bell_name(own, channel.sep))
        extra = (len(bells), repr(bound), member, repr(PLANNED_EPS_MS), HIGHEST,
                 *(_list_level(pri) for pri in channel.priority_steps for _ in queues))
    acks = _take_acks(channel)
    look = (*how, 3 + len(lists) + len(bells) + len(extra_keys), pre + channel.unacked_key,
            pre + channel.unacked_index_key, _FETCH[own], *lists, *bells, *extra_keys,
            repr(time.time()), len(lists), *_JOB_STATE.get(own, ("", "", "")), len(acks),
            *acks, *extra)
    # acks to send: a look first, not a wait that would hold them for its timeout
    if not getattr(channel, "_compass_idle", False) or acks:
        channel._compass_cmd = "EVAL"
        conn.send_command(*look)
        return
    others = [pre + channel._q_for_pri(q, pri) for pri in channel.priority_steps
              for q in queues if not rings(q)]
    wait = channel.brpop_timeout if timeout is None else timeout
    hold_s = getattr(channel, "_compass_hold_s", None)
    if hold_s is not None:  # a held slot looks again at its bound, at the latest
        channel._compass_hold_s = None
        wait = max(0.001, min(wait, hold_s) if wait else hold_s)
    channel._compass_cmd = "WAKE"
    conn.send_packed_command(conn.pack_commands([("BRPOP", *bells, *others, wait or 0),
                                                 look]))


def _fetch_read(channel: Any, **options: Any) -> bool:
    """Read the reply (or, after a wait, both replies) :func:`_fetch_start` asked for;
    deliver a message as kombu does."""
    import kombu.transport.redis as kredis
    from redis.exceptions import NoScriptError

    cmd, client = channel._compass_cmd, channel.client
    channel._compass_idle = False  # after an error: look at every list first
    try:
        try:
            woke = client.parse_response(client.connection, "BRPOP", **options) \
                if cmd == "WAKE" else None
            try:
                got = client.parse_response(client.connection, "EVAL", **options)
                channel._compass_sent_acks = []  # the look ran: its acks are done
            except NoScriptError:  # the look ran nothing: it is sent whole next round
                got, channel._compass_load = None, True
        except channel.connection_errors:
            client.connection.disconnect()  # the next round reconnects
            raise
        except channel.ResponseError as exc:
            channel._compass_off = True
            logger.warning("compass: Redis refused the atomic fetch (%s); this worker "
                           "consumes with kombu's BRPOP", exc)
            raise kredis.Empty() from None
        if got and _is_held(got[0]):  # the slot is held: nothing taken, block until a
            channel._compass_hold_s = float(got[1]) / 1000.0  # push or the bound
            got = None
        # a look that did not run (NOSCRIPT) found nothing: the next round looks again
        channel._compass_idle = not (got or woke or getattr(channel, "_compass_load", False))
        other = _other_message(channel, woke)
        if other is not None:  # kombu's BRPOP of a queue compass does not ring
            if got:
                _put_back(channel, got)  # prefetch stays one: it is taken next
            return _deliver(channel, *other, prefixed=False)
        if not got:
            raise kredis.Empty()
        return _deliver(channel, got[0], got[1], prefixed=True,
                        job_state=got[2] if len(got) > 2 else None)
    finally:
        _acks_back(channel)  # none when the look ran
        channel._in_poll = None
        channel._compass_cmd = None
        flush = getattr(channel, "_flush_brpop_reauth", None)
        if flush is not None:
            flush()


def _queue_of(channel: Any, src: str, prefixed: bool) -> str:
    """The queue list ``src`` belongs to (kombu's client strips its prefix off a BRPOP's
    key, not off a script's reply)."""
    from kombu.utils.encoding import bytes_to_str

    name = bytes_to_str(src)
    pre = channel.global_keyprefix or ""
    if prefixed and pre and name.startswith(pre):
        name = name[len(pre):]
    return name.rsplit(channel.sep, 1)[0]


def _other_message(channel: Any, woke: Any) -> tuple[Any, Any] | None:
    """What the wait popped when it is a message (of a queue that does not ring), not a
    bell's token; None for a token or a timeout."""
    if not woke:
        return None
    from kombu.utils.encoding import bytes_to_str

    name = bytes_to_str(woke[0])
    if name.endswith(channel.sep + BELL) and rings(name[:-len(channel.sep + BELL)]):
        return None
    return woke[0], woke[1]


def _deliver(channel: Any, src: Any, raw: Any, prefixed: bool,
             job_state: Any = None) -> bool:
    """Hand one message to kombu's consumer, as its BRPOP read does (``prefixed``: the
    look's, taken into flight by fetch.lua; ``job_state``: its job's state, read by the
    look, which :func:`fetched_job_state` answers while the message is delivered)."""
    import kombu.transport.redis as kredis
    from kombu.utils.encoding import bytes_to_str

    dest = _queue_of(channel, src, prefixed)
    with contextlib.suppress(ValueError):
        channel._queue_cycle.rotate(dest)
    payload = kredis.loads(bytes_to_str(raw))
    if prefixed:  # fetch.lua's: in flight already, kombu's consumer need not write it
        props = payload.get("properties") if isinstance(payload, dict) else None
        channel._compass_taken = props.get("delivery_tag") if isinstance(props, dict) \
            else None
    tag = channel._compass_taken if prefixed else None
    if isinstance(tag, str) and job_state is not None:
        _fetched_states[tag] = bytes_to_str(job_state)
    # on an event loop, its ack (until the next look) rides the next look (_defer_acks)
    channel._compass_ack_later = getattr(channel.connection.cycle, "_compass_loop", False)
    try:
        channel.connection._deliver(payload, dest)
    finally:
        channel._compass_taken = None
        if isinstance(tag, str):
            _fetched_states.pop(tag, None)
    return True


def _put_back(channel: Any, got: Any) -> None:
    """Return a message the queued look took into flight to its list (unfetch.lua)."""
    from kombu.utils.encoding import bytes_to_str

    src, raw = bytes_to_str(got[0]), bytes_to_str(got[1])
    try:
        tag = json.loads(raw)["properties"]["delivery_tag"]
    except (ValueError, TypeError, KeyError):
        tag = None
    if not isinstance(tag, str):
        return  # not a kombu message: never put in flight; the guard dead-letters it
    pre = channel.global_keyprefix or ""
    bell = pre + bell_name(_queue_of(channel, src, True), channel.sep)
    with channel.conn_or_acquire() as client:  # EVAL's keys: kombu's client prefixes none
        client.execute_command("EVAL", script("unfetch"), 5, pre + channel.unacked_key,
                               pre + channel.unacked_index_key, channel._compass_leases,
                               src, bell, tag, raw, BELL_TTL_MS)


def _fetch_script() -> str:
    """fetch.lua's source, with inflight.lua's helper in front (what EVALSHA names)."""
    return _source("fetch")
