"""Many producer processes routing against one Redis: what reading state costs them.

``compass-celery bench producers --records 1000 --producers 32 --seconds 10``
starts a private ``redis-server``, publishes ``--records`` worker records and keeps
them beating at the workers' own pace (each every ``compass_state_refresh_s``; a
``--changing`` fraction of them change their record on every publish, the rest are
idle and publish the same bytes), reconciles every backlog every ``compass_reconcile_s``
(a ``--drift`` fraction of reconciles find the counter drifted and change it; the others
write the value it holds, which Redis logs as no change), then runs ``--producers``
processes that each route as fast as they can (or once every ``--interval`` seconds, as
web processes between requests do), as the router does: a real :class:`SnapshotReader`
(``compass_snapshot_ttl_s``, reading ahead for ``--refresh-ahead`` seconds past it,
``compass_snapshot_refresh_ahead_s`` by default, and kept fresh for ``--keep-fresh``
seconds after each decision, ``compass_snapshot_keep_fresh_s`` by default), then
:func:`compass_celery.placement.decide` with the compass policy, then the backlog charge
(in the reader's snapshot at once, in Redis through the router's :class:`ChargeBatcher`,
whose unwritten charges each read folds in). Prints decisions/s; the time of every read
that went to Redis, wherever it was made; the decisions that waited for one (read +
decide) and all decisions; how old the state each decision planned on was; and Redis's
egress and CPU over the measured window (``INFO stats``/``INFO cpu`` deltas), with the
producers' share of the egress (the total less what the publisher alone caused in a 2 s
window before).
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from array import array
from typing import Any

import numpy as np
import redis

from compass_celery.local import RedisServer
from compass_celery.needs import TaskNeeds
from compass_celery.placement import decide
from compass_celery.planner import get_policy
from compass_celery.planner.types import WorkerView
from compass_celery.settings import OPTIONS
from compass_celery.state import keys
from compass_celery.state.charges import ChargeBatcher
from compass_celery.state.reader import SnapshotReader
from compass_celery.state.store import FULL_READ_S, RedisStateStore
from compass_celery.state.views import cluster_view

PREFIX = "bench"
QUEUE_PREFIX = "bench.w."
SLOT_S = 0.01  # the publisher writes the records due in each 10 ms in one round trip
MODELS = {f"model-{k:02d}-{kind}": 400.0 + 350.0 * k
          for k, kind in enumerate(("caption", "translate", "detect", "qa", "tts", "ocr",
                                    "embed", "rank"))}


def _view(i: int, tick: int, changing: bool) -> WorkerView:
    """Worker ``i``'s state; a changing worker's free memory moves with every tick."""
    names = list(MODELS)
    name = f"gpu{i:04d}@bench-host-{i // 8:03d}"
    resident = frozenset(names[(i + k) % len(names)] for k in range(2))
    free = 16000.0 - sum(MODELS[m] for m in resident) - (tick % 7 if changing else 0)
    return WorkerView(name=name, queue=QUEUE_PREFIX + name, device="cuda:0",
                      gpu_total_mb=16000.0, gpu_free_mb=free, resident=resident,
                      speed=1.0, heartbeat=1.0)


def _extra(i: int, tick: int, changing: bool) -> dict[str, Any]:
    """The informational fields a real worker adds (pid and cache counters)."""
    hits = tick if changing else 0
    return {"pid": 10000 + i, "hits": hits, "misses": 3, "loads": 3, "evictions": 1}


def _publisher(url: str, records: int, changing: float, stop: Any, ready: Any,
               out: Any, drift: float = 1.0) -> None:
    """Publish every record at the workers' pace until ``stop`` is set."""
    store = RedisStateStore(url, PREFIX, queue_prefix=QUEUE_PREFIX)
    interval = float(OPTIONS["state_refresh_s"].default)
    reconcile = float(OPTIONS["reconcile_s"].default)
    n_changing = int(round(records * changing))
    rng = random.Random(7)
    backlog = [0.0] * records
    for i in range(records):
        store.publish(_view(i, 0, i < n_changing), **_extra(i, 0, i < n_changing))
    ready.set()
    # the records due in one slot go in one pipeline: Redis runs every worker's publish
    # script as before, while this one process, standing in for a thousand hosts, spends
    # less of the shared cores that the producers under test need
    per_slot = max(1, int(records * SLOT_S / interval))
    start, published, late, tick = time.monotonic(), 0, 0, 0
    while not stop.is_set():
        tick += 1
        for first in range(0, records, per_slot):
            due = start + (tick - 1) * interval + interval * first / records
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif wait < -interval:
                late += 1
            pipe = store.client.pipeline(transaction=False)
            for i in range(first, min(records, first + per_slot)):
                ch = i < n_changing
                store.publish(_view(i, tick, ch), pipe=pipe, **_extra(i, tick, ch))
                published += 1
                if rng.random() < interval / reconcile:  # each reconciles every reconcile_s
                    if rng.random() < drift:
                        backlog[i] = round(rng.uniform(0.0, 300.0), 1)
                    store.set_backlog(_view(i, 0, False).name, backlog[i], pipe=pipe)
            store.execute(pipe)
            if stop.is_set():
                break
    out.put({"published": published, "seconds": time.monotonic() - start, "late": late})


def _producer(url: str, seed: int, start_at: float, seconds: float, ahead: float,
              out: Any, interval_s: float = 0.0, keep_fresh: float = 0.0) -> None:
    """Route from ``start_at`` for ``seconds``, as fast as possible or one decision every
    ``interval_s`` (a web process between requests); report timings."""
    # as a Compass app's store: heartbeats only with the full reads (routing needs none)
    store = RedisStateStore(url, PREFIX, queue_prefix=QUEUE_PREFIX, beat_sync_s=FULL_READ_S)
    reader = SnapshotReader(store, float(OPTIONS["snapshot_ttl_s"].default),
                            float(OPTIONS["heartbeat_timeout_s"].default), refresh_ahead_s=ahead,
                            keep_fresh_s=keep_fresh)
    charges = ChargeBatcher(store, float(OPTIONS["charge_linger_s"].default))
    reader.charges = charges
    reader.prepare = lambda snap: cluster_view(snap, MODELS)  # as a Compass app's router
    reads, snapshot = array("d"), store.snapshot

    def timed_snapshot(now: float, timeout_s: float) -> Any:
        t = time.perf_counter()
        snap = snapshot(now, timeout_s)
        reads.append(time.perf_counter() - t)
        return snap

    store.snapshot = timed_snapshot  # type: ignore[method-assign]
    policy = get_policy("compass")
    rng = random.Random(seed)
    needs_list = [TaskNeeds(task=f"bench.{m}", model=m, exec_ms=40.0, output_kb=0.0,
                      exec_source="declared") for m in MODELS]
    reader.get()  # the first (full) read is not measured
    time.sleep(max(0.0, start_at - time.time()))
    del reads[:]
    fetched0, flushes0 = store.records_fetched, charges.flushes
    fresh_decision, decision, age = array("d"), array("d"), array("d")
    end = start_at + seconds
    clock = time.perf_counter
    while time.time() < end:
        before = reader.waits
        t0 = clock()
        snap = reader.get()
        d = decide(rng.choice(needs_list), snap, policy, MODELS, "bench.shared")
        t2 = clock()
        decision.append(t2 - t0)
        age.append(time.time() - snap.taken_at)
        if reader.waits != before:  # read first, or waited for the read under way
            fresh_decision.append(t2 - t0)
        if d.charge_ms:
            reader.note_charge(d.worker, d.charge_ms)
            charges.add(d.worker, d.charge_ms)
        if interval_s:
            time.sleep(max(0.0, interval_s - (clock() - t0)))
    out.put({"decisions": len(decision), "fresh": reads.tobytes(),
             "fresh_decision": fresh_decision.tobytes(), "decision": decision.tobytes(),
             "age": age.tobytes(), "records_fetched": store.records_fetched - fetched0,
             "charge_flushes": charges.flushes - flushes0,
             "workers_seen": len(reader.get().workers)})


def _info(client: Any) -> tuple[int, float]:
    """Redis's bytes sent so far and CPU seconds used so far."""
    stats, cpu = client.info("stats"), client.info("cpu")
    return (int(stats["total_net_output_bytes"]),
            float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))


def _publisher_alone(client: Any, seconds: float = 2.0) -> tuple[float, float]:
    """What the publisher alone makes Redis send and spend (its replies) per second, to
    subtract from the measured window: (bytes/s, CPU s/s)."""
    bytes0, cpu0, t0 = *_info(client), time.time()
    time.sleep(seconds)
    bytes1, cpu1, t1 = *_info(client), time.time()
    return (bytes1 - bytes0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)


def _pct(samples: np.ndarray, q: float) -> float:
    return float(np.percentile(samples, q) * 1e3) if samples.size else float("nan")


def run(records: int, producers: int, seconds: float, changing: float = 0.1,
        warmup_s: float = 2.0, ahead: float | None = None, drift: float = 1.0,
        interval_s: float = 0.0, keep_fresh: float | None = None) -> dict[str, Any]:
    """One measurement; returns the numbers the command prints. ``ahead`` and
    ``keep_fresh`` default to the settings' defaults, except that ``ahead=0`` (decisions
    wait for their reads) also turns keeping fresh off unless ``keep_fresh`` is given."""
    ctx = mp.get_context("fork")
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        stop, ready, pub_out = ctx.Event(), ctx.Event(), ctx.Queue()
        pub = ctx.Process(target=_publisher,
                          args=(server.url, records, changing, stop, ready, pub_out, drift))
        pub.start()
        if not ready.wait(120):
            raise RuntimeError("publisher did not start")
        raw = client.hgetall(keys.key(keys.WORKERS, PREFIX))
        record_bytes = sum(len(v) for v in raw.values()) / max(1, len(raw))
        background, background_cpu = _publisher_alone(client)
        out = ctx.Queue()
        start_at = time.time() + warmup_s + 0.05 * producers
        if ahead is None:
            ahead = float(OPTIONS["snapshot_refresh_ahead_s"].default)
        if keep_fresh is None:
            keep_fresh = float(OPTIONS["snapshot_keep_fresh_s"].default) if ahead else 0.0
        procs = [ctx.Process(target=_producer,
                             args=(server.url, k, start_at, seconds, ahead, out,
                                   interval_s, keep_fresh))
                 for k in range(producers)]
        for p in procs:
            p.start()
        time.sleep(max(0.0, start_at - time.time()))
        bytes0, cpu0 = _info(client)
        t0 = time.time()
        results = [out.get(timeout=seconds + 120) for _ in procs]
        elapsed = time.time() - t0
        bytes1, cpu1 = _info(client)
        for p in procs:
            p.join(10)
        stop.set()
        pub_stats = pub_out.get(timeout=30)
        pub.join(10)
    total = sum(r["decisions"] for r in results)
    arrays = {k: np.concatenate([np.frombuffer(r[k], dtype="d") for r in results])
              for k in ("fresh", "fresh_decision", "decision", "age")}
    egress = bytes1 - bytes0
    readers = max(0.0, egress - background * elapsed)  # producers' share
    return {
        "records": records, "producers": producers, "seconds": seconds,
        "changing": changing, "drift": drift, "record_bytes": round(record_bytes, 1),
        "workers_seen": min(r["workers_seen"] for r in results),
        "publishes_per_s": round(pub_stats["published"] / pub_stats["seconds"], 1),
        "decisions_per_s": round(total / seconds, 1),
        "refresh_ahead_s": ahead, "keep_fresh_s": keep_fresh, "interval_s": interval_s,
        "fresh_reads_per_s": round(arrays["fresh"].size / seconds, 1),
        "waited_decisions_per_s": round(arrays["fresh_decision"].size / seconds, 1),
        "fresh_read_ms": {"p50": _pct(arrays["fresh"], 50), "p99": _pct(arrays["fresh"], 99)},
        "fresh_decision_ms": {"p50": _pct(arrays["fresh_decision"], 50),
                              "p99": _pct(arrays["fresh_decision"], 99)},
        "decision_ms": {"p50": _pct(arrays["decision"], 50),
                        "p99": _pct(arrays["decision"], 99)},
        "state_age_ms": {"p50": _pct(arrays["age"], 50), "p99": _pct(arrays["age"], 99),
                         "max": float(arrays["age"].max() * 1e3) if arrays["age"].size
                         else float("nan")},
        "redis_egress_bytes_per_s": round(egress / elapsed, 1),
        "publisher_egress_bytes_per_s": round(background, 1),
        "producer_egress_bytes_per_s": round(readers / elapsed, 1),
        "producer_egress_bytes_per_decision": round(readers / max(1, total), 1),
        "producer_egress_bytes_per_fresh_read": round(readers / max(1, arrays["fresh"].size),
                                                      1),
        # what a read fetched, apart from the charges' replies that share the egress
        "records_per_fresh_read": round(sum(r["records_fetched"] for r in results)
                                        / max(1, arrays["fresh"].size), 2),
        "charge_flushes_per_s": round(sum(r["charge_flushes"] for r in results) / seconds, 1),
        "redis_cpu_per_s": round((cpu1 - cpu0) / elapsed, 3),
        "publisher_redis_cpu_per_s": round(background_cpu, 3),
    }


def report(r: dict[str, Any]) -> str:
    """One human-readable block for a result of :func:`run`."""
    f, fd, d = r["fresh_read_ms"], r["fresh_decision_ms"], r["decision_ms"]
    a = r["state_age_ms"]
    return "\n".join([
        f"records {r['records']} ({r['record_bytes']:.0f} B each, {r['changing']:.1%} changing, "
        f"{r.get('drift', 1.0):.0%} of reconciles drifted), "
        f"producers {r['producers']}"
        + (f" (one decision every {r['interval_s']:g} s each)" if r.get("interval_s") else "")
        + f", {r['seconds']:.0f} s; "
        f"publishes/s {r['publishes_per_s']:.0f}; live workers seen {r['workers_seen']}",
        f"  decisions/s              {r['decisions_per_s']:12.0f}",
        f"  reads/s (to Redis)       {r['fresh_reads_per_s']:12.0f}  (read ahead for "
        f"{r['refresh_ahead_s']:g} s past the TTL, kept fresh {r['keep_fresh_s']:g} s "
        "after a decision)",
        f"  read ms (any thread)     p50 {f['p50']:8.3f}  p99 {f['p99']:8.3f}",
        f"  decisions that waited    {r['waited_decisions_per_s']:12.0f}  per s",
        f"  ... their ms (read+plan) p50 {fd['p50']:8.3f}  p99 {fd['p99']:8.3f}",
        f"  decision ms (all)        p50 {d['p50']:8.3f}  p99 {d['p99']:8.3f}",
        f"  state age at decision ms p50 {a['p50']:8.1f}  p99 {a['p99']:8.1f}  max "
        f"{a['max']:.1f}",
        f"  Redis egress bytes/s     {r['redis_egress_bytes_per_s']:12.0f}  (publisher "
        f"alone {r['publisher_egress_bytes_per_s']:.0f})",
        f"  producers' egress B/s    {r['producer_egress_bytes_per_s']:12.0f}",
        f"  producers' B/decision    {r['producer_egress_bytes_per_decision']:12.1f}",
        f"  producers' B/read        {r['producer_egress_bytes_per_fresh_read']:12.1f}  "
        f"(records a read fetched {r['records_per_fresh_read']:.1f}; the charges' "
        f"{r['charge_flushes_per_s']:.0f} flushes/s share the egress)",
        f"  Redis CPU s/s            {r['redis_cpu_per_s']:12.3f}  (publisher alone "
        f"{r['publisher_redis_cpu_per_s']:.3f})",
    ])
