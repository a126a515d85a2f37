"""Dead workers: drain their own queues and re-place the tasks on live workers.

Per-worker queues bring a failure mode plain Celery lacks: nothing else
consumes a dead worker's queue, and its unacked message would come back to
that same queue after the transport's visibility timeout. Every live worker
runs :func:`recover` periodically; a Redis lock makes exactly one of them
drain each dead worker (``drain.lua`` takes the waiting messages and the dead
worker's in-flight ones out atomically), and each task is re-planned against
live state and pushed to its new worker's queue. The job runtime makes a
redelivered task's completion idempotent.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from . import keys
from .placement import Decision, PlacementError, decide
from .profiles import Demand
from .records import RecordError, decode_record
from .scripts import script
from .state import StateUnavailable
from .transport import RedisLayout

if TYPE_CHECKING:
    from .app import Compass

logger = logging.getLogger("compass_celery.recovery")

DEAD_QUEUES_KEY, DRAIN_LOCK_KEY = keys.DEAD_QUEUES, keys.DRAIN_LOCK


def dead_workers(client: Any, prefix: str, now: float, timeout_s: float
                 ) -> list[tuple[str, str]]:
    """(name, queue) of records whose heartbeat is older than ``timeout_s``."""
    out = []
    for key, raw in client.hgetall(keys.key(keys.WORKERS, prefix)).items():
        name = key.decode("utf-8", "replace")
        try:
            view = decode_record(raw, field_name=name)
        except RecordError:
            continue  # a garbled record names no trustworthy queue; readers skip it
        if now - view.heartbeat > timeout_s:
            out.append((view.name, view.queue))
    return out


def recover(c: Compass, me: str, now: float | None = None) -> int:
    """Drain every dead worker this process wins the lock for; return tasks re-placed."""
    now = time.time() if now is None else now
    cfg = c.settings
    client = c.store.client
    prefix = cfg["key_prefix"]
    moved = 0
    for name, queue in dead_workers(client, prefix, now, cfg["heartbeat_timeout_s"]):
        if name == me:
            continue
        lock = DRAIN_LOCK_KEY.format(p=prefix, name=name)
        if not client.set(lock, me, nx=True, ex=max(5, int(cfg["heartbeat_timeout_s"] * 4))):
            continue
        logger.warning("compass: worker %s is dead (no heartbeat for %.1fs); draining %s",
                       name, cfg["heartbeat_timeout_s"], queue)
        client.sadd(DEAD_QUEUES_KEY.format(p=prefix), queue)
        c.store.remove(name)
        moved += drain_queue(c, queue)
    live = {w.queue for w in c.store.snapshot(now, cfg["heartbeat_timeout_s"]).workers}
    for raw_queue in client.smembers(DEAD_QUEUES_KEY.format(p=prefix)):
        queue = raw_queue.decode()
        if queue in live:  # the worker came back under the same name
            client.srem(DEAD_QUEUES_KEY.format(p=prefix), queue)
        elif client.llen(queue) or _has_unacked(client, queue):
            moved += drain_queue(c, queue)  # late redeliveries (visibility timeout)
    return moved


def mark_alive(c: Compass, queue: str) -> None:
    """A worker (re)starting under a name found dead takes its queue back."""
    c.store.client.srem(DEAD_QUEUES_KEY.format(p=c.settings["key_prefix"]), queue)


def _has_unacked(client: Any, queue: str) -> bool:
    return any(json.loads(v)[2] == queue for v in client.hvals(RedisLayout().unacked)
               if v.startswith(b"["))


def drain_queue(c: Compass, queue: str) -> int:
    """Atomically take ``queue``'s messages (waiting and in flight) and re-place each."""
    client = c.store.client
    layout = RedisLayout()
    drain = client.register_script(script("drain"))
    items = drain(keys=[queue, layout.unacked, layout.unacked_index], args=[queue])
    split = items.index(b"--inflight--")
    waiting = list(reversed(items[:split]))  # next-to-run first (kombu pops the right end)
    inflight = [json.loads(e)[0] for e in items[split + 1:]]
    count = 0
    for message in [*(json.loads(m) for m in waiting), *inflight]:
        try:
            replace_message(c, message)
            count += 1
        except Exception:  # never drop a message: park it on the shared queue
            logger.exception("compass: re-placing a message from %s failed; shared queue", queue)
            _push(c, message, c.shared_queue)
            count += 1
    if count:
        logger.warning("compass: re-placed %d task(s) from %s", count, queue)
    return count


def replace_message(c: Compass, message: dict[str, Any]) -> str:
    """Re-plan one raw kombu message against live state and push it; return its queue."""
    headers = message.setdefault("headers", {})
    old = Decision.from_header(headers.get("compass"))
    task = headers.get("task", "?")
    try:
        snapshot = c.reader.get()
        if old is None:
            raise PlacementError("no compass decision on the message")
        demand = Demand(task, old.model, old.run_ms, 0.0, "declared")
        decision = decide(demand, snapshot, c.policy, c.model_sizes(), c.shared_queue)
    except (StateUnavailable, PlacementError) as exc:
        logger.warning("compass: %s -> shared queue (%s)", task, exc)
        decision = None
    if decision is None or decision.fallback:
        queue = c.shared_queue
        if old is not None:
            headers["compass"] = {**old.as_header(), "worker": "*", "queue": queue,
                                  "charge_ms": 0.0, "fallback": True}
    else:
        queue = decision.queue
        headers["compass"] = decision.as_header()
        if decision.charge_ms:
            c.store.charge(decision.worker, decision.charge_ms)
    _push(c, message, queue)
    return queue


def _push(c: Compass, message: dict[str, Any], queue: str) -> None:
    props = message.setdefault("properties", {})
    info = props.setdefault("delivery_info", {})
    info["routing_key"] = queue
    info.setdefault("exchange", "")
    c.store.client.lpush(queue, json.dumps(message))
