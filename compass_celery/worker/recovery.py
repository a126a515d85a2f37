"""Stopped and dead workers: their queues are drained and the tasks re-placed.

Per-worker queues bring a failure mode plain Celery lacks: nothing else
consumes a stopped or dead worker's queue, and its in-flight message would come
back to that same queue after the transport's visibility timeout. So:

- a worker that stops cleanly hands its own queue back (:func:`hand_back`) and
  leaves its queue name in the dead-queue set, so late arrivals are drained too;
- each tick, one live worker (the leader, a Redis lock with a short expiry)
  finds workers whose heartbeat lapsed *on Redis's clock*, marks their queues
  dead, and drains every dead queue (:func:`recover`); it also forgets leases
  nobody renewed for ``PRUNE_AFTER_TIMEOUTS`` lease timeouts (ended tasks' are deleted
  by their worker at once);
- a drain never holds a message only in memory: messages are staged in Redis in
  one atomic step, then moved one at a time, atomically, to their new queue or
  to the dead-letter list (:class:`~compass_celery.broker.kombu_redis.RedisQueues`). A
  drainer killed anywhere leaves them staged, and the next leader resumes. Over
  RabbitMQ (:class:`~compass_celery.broker.amqp.AmqpQueues`) a message stays
  unacked on the drainer's connection until its copy is confirmed in its new
  queue, and the broker returns it if the drainer dies;
- in-flight messages whose runner still renews its lease are left alone, so a
  stopping worker's running task, or a long one, never runs twice; the shared queue's
  in-flight messages whose lease lapsed are re-placed too (:func:`recover_shared`);
- the leader also fails jobs past their deadline, whether anyone waits on them
  or not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import ledger
from ..broker.kombu_redis import BrokerQueues, MessageError, parse_message, redis_time
from ..jobs.failure import sweep_overdue
from ..needs import TaskDeclarationError, TaskNeeds, batch_options
from ..placement import Decision, PlacementError, decide
from ..planner.batch import BatchSpec
from ..planner.types import SHARED
from ..state import keys
from ..state.connection import StateUnavailable, text

if TYPE_CHECKING:
    from ..context import CompassContext

logger = logging.getLogger("compass_celery.recovery")

#: A drained dead queue is forgotten after staying empty this many heartbeat timeouts.
PRUNE_AFTER_TIMEOUTS = 10

_reported: set[str] = set()  # skipped-record reasons already logged by this process


def mark_dead(c: CompassContext, queue: str) -> None:
    """Put ``queue`` in the dead-queue set: the leader drains it until it stays empty."""
    client = c.store.client
    dead = keys.key(keys.DEAD_QUEUES, c.settings.key_prefix)
    client.zadd(dead, {queue: redis_time(client)}, nx=True)


def mark_alive(c: CompassContext, queue: str) -> None:
    """A worker (re)starting under a name found dead takes its queue back."""
    c.store.client.zrem(keys.key(keys.DEAD_QUEUES, c.settings.key_prefix), queue)


def lease_timeout_s(c: CompassContext) -> float:
    """A lease not renewed for this long is lapsed (renewed every third of it)."""
    return float(c.settings.heartbeat_timeout_s)


def recover(c: CompassContext, me: str, interval_s: float) -> int:
    """One recovery round if this worker wins the leader lock; returns tasks re-placed."""
    queues = c.queues
    if queues is None:
        return 0
    cfg = c.settings
    client = c.store.client
    prefix = cfg.key_prefix
    leader = keys.key(keys.RECOVERY_LEADER, prefix)
    if not client.set(leader, me, nx=True, px=max(100, int(interval_s * 1000 * 0.9))):
        return 0
    # deadlines are stamped by the submitting host, so judged by a host clock too
    swept = sweep_overdue(c, time.time())
    if swept:
        logger.warning("compass: failed %d job(s) past their deadline", swept)
    timeout = cfg.heartbeat_timeout_s
    # liveness, like every reader's, from the snapshot: beats on Redis's clock, and
    # records naming a queue other than their own refused (never drained)
    snapshot = c.store.snapshot(time.time(), timeout)
    for why in snapshot.skipped:
        if "forged" in why and why not in _reported:
            _reported.add(why)
            logger.error("compass: %s", why)
    for name, queue in snapshot.dead:
        if name == me:
            continue
        logger.warning("compass: worker %s is dead (no heartbeat for %.1fs on Redis's "
                       "clock); draining %s", name, timeout, queue)
        mark_dead(c, queue)
        c.store.remove(name)
    shared = recover_shared(c, queues)  # before the prune forgets a dead worker's leases
    # every tick, dead queue or not: a lease its runner stopped renewing (a killed
    # process, whose ended tasks were never dropped) is forgotten in bounded time
    queues.prune_leases(PRUNE_AFTER_TIMEOUTS * lease_timeout_s(c))
    dead_key = keys.key(keys.DEAD_QUEUES, prefix)
    marked = {text(q): t
              for q, t in client.zrange(dead_key, 0, -1, withscores=True)}
    if not marked:
        return shared
    live = {w.name for w in snapshot.workers}
    todo = []
    for queue in marked:
        name = queue[len(cfg.queue_prefix):]
        if not queue.startswith(cfg.queue_prefix):
            client.zrem(dead_key, queue)  # never drain a queue compass does not own
        elif name in live:
            client.zrem(dead_key, queue)  # the worker came back under the same name
        else:
            todo.append(queue)
    counts = queues.stage(todo, lease_timeout_s(c))
    moved = sum(replace_staged(c, queues, q) for q in todo)
    now = redis_time(client)
    for queue in todo:
        _, leased = counts.get(queue, (0, 0))
        if not leased and not queues.has_work(queue) \
                and now - marked[queue] > PRUNE_AFTER_TIMEOUTS * timeout:
            client.zrem(dead_key, queue)
    return moved + shared


def recover_shared(c: CompassContext, queues: BrokerQueues) -> int:
    """Re-place the shared queue's in-flight messages whose lease lapsed: a dead worker
    held them, and its own queue's drain does not see them (their routing key is the
    shared queue's); kombu would return them only after its visibility timeout (an
    hour). Messages nobody leased are left to that timeout. Nothing to do over AMQP."""
    if queues.returns_unacked:
        return 0
    queues.stage([c.shared_queue], lease_timeout_s(c), in_flight_only=True)
    return replace_staged(c, queues, c.shared_queue)  # a killed leader's staged ones too


def hand_back(c: CompassContext, me: str) -> int:
    """A stopping worker re-places everything waiting in its own queue (priority lists
    too) on the other live workers, or on the shared queue when none is left."""
    queues = c.queues
    if queues is None:
        return 0
    queue = c.queue_for(me)
    queues.stage([queue], lease_timeout_s(c), with_unacked=False)
    return replace_staged(c, queues, queue, exclude=me)


def take_back(c: CompassContext, me: str) -> int:
    """A starting worker re-places what a previous process under its name left in
    flight or staged (a same-name restart); nothing of its own runs yet. Over AMQP
    the broker has already put those back in the queue, which it now consumes."""
    queues = c.queues
    if queues is None or queues.returns_unacked:
        return 0
    queue = c.queue_for(me)
    queues.stage([queue], 0.0)  # every in-flight entry: no process of ours runs it now
    return replace_staged(c, queues, queue)


def replace_staged(c: CompassContext, queues: BrokerQueues, queue: str,
                   exclude: str | None = None) -> int:
    """Re-place ``queue``'s staged messages one at a time; unusable ones are
    dead-lettered with a log line naming why. Redis errors propagate: the rest
    stay staged for the next round."""
    moved = 0
    while (raw := queues.next_staged(queue)) is not None:
        try:
            message = parse_message(raw)
        except MessageError as exc:
            if queues.dead_letter(queue, raw, str(exc)):
                logger.error("compass: an entry in %s is unusable (%s); moved to %s: %.120r",
                             queue, exc, queues.dead_letter_key, raw)
            continue
        target, decision = plan_message(c, message, exclude)
        priority = (message.get("properties") or {}).get("priority")
        if queues.move(queue, raw, queues.target(target, priority), json.dumps(message)):
            moved += 1
            if decision is not None:
                with contextlib.suppress(StateUnavailable):  # reconciled by its worker
                    ledger.charge(c, decision)
    if moved:
        logger.warning("compass: re-placed %d task(s) from %s", moved, queue)
    return moved


def plan_message(c: CompassContext, message: dict[str, Any], exclude: str | None = None
                 ) -> tuple[str, Decision | None]:
    """Re-plan one message against live state (never on ``exclude``); rewrite its
    compass header and routing key in place; return its new queue.

    Only where it goes is decided again, from its speed-1.0 run time (the old worker's
    speed is not applied twice): the task's own fields (level, age, SLO class, due
    time, latest start, batch key; ``placement.CARRIED``) are kept whole."""
    headers = message["headers"]
    old = Decision.from_header(headers.get("compass"))
    task = headers.get("task", "?")
    decision: Decision | None = None
    try:
        if old is None:
            raise PlacementError("no compass decision on the message")
        snapshot = c.reader.get()
        if exclude is not None:
            snapshot = replace(snapshot, workers=tuple(w for w in snapshot.workers
                                                       if w.name != exclude))
        needs = TaskNeeds(task, old.model, old.planned_exec_ms, 0.0, "declared",
                          _batch_of(c, task, old))
        decision = old.replaced(decide(needs, snapshot, c.policy, c.model_sizes(),
                                       c.shared_queue, priority=old.priority,
                                       hold_max_ms=c.settings.hold_max_ms))
    except (StateUnavailable, PlacementError) as exc:
        logger.warning("compass: %s -> shared queue (%s)", task, exc)
    if decision is None or decision.fallback:
        queue = c.shared_queue
        if old is not None:  # the task whole, on the shared queue, charging nothing
            headers["compass"] = replace(old, worker=SHARED, queue=queue, charge_ms=0.0,
                                         fallback=True).as_header()
        decision = None
    else:
        queue = decision.queue
        headers["compass"] = decision.as_header()
    props = message.setdefault("properties", {})
    info = props.setdefault("delivery_info", {})
    info["routing_key"] = queue
    info.setdefault("exchange", "")
    return queue, decision


def _batch_of(c: CompassContext, task: str, old: Decision) -> BatchSpec | None:
    """The batch spec of a batched task being re-placed (its declaration, under the key
    it was sent with), so it joins a batch forming elsewhere; None when unbatched."""
    if not old.batch:
        return None
    try:
        spec = batch_options(c.app.tasks.get(task))
    except TaskDeclarationError:
        return None
    return replace(spec, key=old.batch) if spec is not None else None
