"""The fetch-window hunt: plain tasks sent at a steady rate while workers are SIGKILLed and
restarted under their own names at random moments; every message is then accounted for."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from compass_celery.bench.faults import kill_restart_loop
from compass_celery.broker.fetch import BELL
from compass_celery.broker.kombu_redis import RedisLayout, message_headers
from compass_celery.local import WorkerProcess


@dataclass
class Hunt:
    """What a hunt sent and how each message ended."""

    sent: list[str] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    completed: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    dead_lettered: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # task id -> where it was found
    duplicates: int = 0
    stranded: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: the counts a report quotes."""
        starting = sum(1 for k in self.kills if k.get("within_3s_of_start"))
        return (f"sent {len(self.sent)}, kills {len(self.kills)} ({starting} within 3 s of the "
                f"worker's start), completed {self.completed}, "
                f"failed {len(self.failed)}, dead-lettered {len(self.dead_lettered)}, "
                f"lost {len(self.missing)} {sorted(self.missing.values())}, duplicates "
                f"{self.duplicates}, stranded {self.stranded}")


def produce(app: Any, rate: float, stop: threading.Event, sent: list[str]) -> None:
    """Send ``j.src`` at ``rate`` per second (routed by compass) until ``stop``."""
    task, n, t0 = app.tasks["j.src"], 0, time.monotonic()
    while not stop.is_set():
        sent.append(task.apply_async((n,)).id)
        n += 1
        stop.wait(max(0.0, t0 + n / rate - time.monotonic()))


def run_hunt(app: Any, workers: list[WorkerProcess], kills: int, every_s: float,
             rate: float, wait_s: float, seed: int | None = None) -> Hunt:
    """Send while killing; then wait up to ``wait_s`` for every message to end."""
    hunt, stop = Hunt(), threading.Event()
    producer = threading.Thread(target=produce, args=(app, rate, stop, hunt.sent), daemon=True)
    producer.start()
    t0 = time.monotonic()
    kill_restart_loop(workers, kills, every_s, threading.Event(), hunt.kills,
                      lambda: round(time.monotonic() - t0, 2), random.Random(seed))
    stop.set()
    producer.join()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and account(app, hunt):
        time.sleep(0.5)
    return hunt


def _results(app: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
    client, out = app.log, {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        for tid, raw in zip(chunk, client.mget([f"celery-task-meta-{t}" for t in chunk]),
                            strict=True):
            if raw is not None:
                out[tid] = json.loads(raw)
    return out


def account(app: Any, hunt: Hunt) -> int:
    """Sort every sent message into completed, failed, dead-lettered or missing (with
    where it sits); -> how many are not ended yet."""
    client = app.log
    results = _results(app, hunt.sent)
    dead = {message_headers(json.loads(e)["raw"]).get("id")
            for e in client.lrange(f"{app.compass.settings['key_prefix']}:dead-letter", 0, -1)}
    hunt.completed, hunt.failed, hunt.dead_lettered, hunt.missing = 0, {}, [], {}
    where = locate(app) if len(results) < len(hunt.sent) else {}
    for tid in hunt.sent:
        r = results.get(tid)
        if r is not None and r.get("status") == "SUCCESS":
            hunt.completed += 1
        elif r is not None and r.get("status") == "FAILURE":
            hunt.failed[tid] = str(r.get("result"))[:200]
        elif tid in dead:
            hunt.dead_lettered.append(tid)
        else:
            hunt.missing[tid] = where.get(tid, "nowhere in Redis")
    execs = {k.decode(): int(v) for k, v in client.hgetall("execs").items()}
    hunt.duplicates = sum(n - 1 for n in execs.values() if n > 1)
    hunt.stranded = stranded(app)
    return len(hunt.missing)


def locate(app: Any) -> dict[str, str]:
    """Task id -> the Redis key (queue list, staging, unacked, in-flight) holding it."""
    client, out = app.log, {}
    for raw_key in client.scan_iter("*"):
        name = raw_key.decode("utf-8", "replace")
        kind = client.type(raw_key).decode()
        if kind == "list":
            entries = client.lrange(raw_key, 0, -1)
        elif kind == "hash" and not name.startswith("celery-task-meta") and name != "execs":
            entries = client.hvals(raw_key)
        else:
            continue
        for e in entries:
            tid = _id_of(e)
            if tid:
                out[tid] = name.replace(RedisLayout().sep, "/")
    return out


def _id_of(raw: bytes) -> str | None:
    try:
        msg = json.loads(raw)
    except ValueError:
        return None
    if isinstance(msg, list) and msg:
        msg = msg[0]
    return message_headers(json.dumps(msg)).get("id") if isinstance(msg, dict) else None


def stranded(app: Any) -> dict[str, int]:
    """Messages left in any compass queue list, staging list, unacked or in-flight entry."""
    client, out = app.log, {}
    for raw_key in client.scan_iter("*"):
        name = raw_key.decode("utf-8", "replace")
        kind = client.type(raw_key).decode()
        size = (client.llen(raw_key) if kind == "list" and name.startswith(
                    ("compass.", "compass:staging:", "compass:inflight:"))
                and not name.endswith(RedisLayout().sep + BELL)  # wake-up tokens
                else client.hlen(raw_key) if kind == "hash" and name == "unacked" else 0)
        if size:
            out[name.replace(RedisLayout().sep, "/")] = int(size)
    return out

