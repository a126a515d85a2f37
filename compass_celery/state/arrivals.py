"""Job arrivals per SLO class, counted in Redis by whoever submits, read by an
autoscaler controller.

The rule (``planner.scaling``) sizes the fleet from each class's arrival rate. A
controller that runs beside the producers (another pod, another host) cannot see their
submissions in its own process; so each submission adds one to its class in the current
wall-clock bucket (a hash per bucket, :data:`ARRIVAL_BUCKET_S` wide, expiring after
:data:`ARRIVAL_TTL_S`). An admitted job's count rides in the transaction that records
its deadline (no extra round trip; the key shares the cluster state's hash tag, so it
stays in that step's slot on a Redis Cluster); a refused job's is one pipelined
HINCRBY on the refusal path. A process sets a bucket's TTL with its first arrival there
and sends the HINCRBY alone after that; the reader sets it again on what it reads.
:class:`ArrivalCounter` reads the buckets back and hands out only what it has not seen,
re-reading the last few buckets so that a producer whose clock or write lags a little is
still counted once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import keys

#: Seconds of wall clock one bucket covers.
ARRIVAL_BUCKET_S = 1.0
#: Seconds a bucket is kept: the longest rate window a controller may read back.
ARRIVAL_TTL_S = 3600
#: Buckets behind the newest that are read again at each poll (late writes, clock skew).
ARRIVAL_LAG_BUCKETS = 5


def bucket_of(t_s: float, bucket_s: float = ARRIVAL_BUCKET_S) -> int:
    """The bucket holding wall-clock time ``t_s``."""
    return int(t_s // bucket_s)


def arrivals_key(prefix: str, bucket: int) -> str:
    """The hash counting bucket ``bucket``'s arrivals per class."""
    return keys.key(keys.ARRIVALS, prefix, bucket=str(bucket))


#: The bucket key this process last set a TTL on: later arrivals in the same bucket send
#: the HINCRBY alone (one command per submission; another process sets it again, harmless).
_EXPIRED: set[str] = set()


def count_arrival(pipe: Any, prefix: str, cls: str, now_s: float | None = None,
                  bucket_s: float = ARRIVAL_BUCKET_S, ttl_s: int = ARRIVAL_TTL_S) -> None:
    """Queue one arrival of class ``cls`` on ``pipe`` (a pipeline or a client), and the
    bucket's TTL the first time this process writes to that bucket."""
    key = arrivals_key(prefix, bucket_of(time.time() if now_s is None else now_s, bucket_s))
    pipe.hincrby(key, cls, 1)
    if key not in _EXPIRED:
        pipe.expire(key, ttl_s)
        if len(_EXPIRED) > 64:  # older buckets are never written again by this process
            _EXPIRED.clear()
        _EXPIRED.add(key)


def count_refused_arrival(client: Any, prefix: str, cls: str) -> None:
    """One refused job's arrival, on its own pipeline (one round trip)."""
    pipe = client.pipeline(transaction=False)
    count_arrival(pipe, prefix, cls)
    pipe.execute()


class ArrivalCounter:
    """The controller's side: each :meth:`poll` returns the arrivals counted since the
    last one, as (class, age in seconds, count), the age from the middle of the bucket
    they were counted in. The first poll reads ``backfill_s`` back (a restarted
    controller starts from the rate the producers saw, not from nothing)."""

    def __init__(self, client: Any, prefix: str, *, backfill_s: float = 0.0,
                 bucket_s: float = ARRIVAL_BUCKET_S, lag_buckets: int = ARRIVAL_LAG_BUCKETS,
                 wall: Callable[[], float] = time.time) -> None:
        if not bucket_s > 0 or lag_buckets < 0 or backfill_s < 0:
            raise ValueError("bucket_s must be > 0, lag_buckets and backfill_s >= 0")
        if backfill_s > ARRIVAL_TTL_S:
            raise ValueError(f"backfill_s {backfill_s:g} is longer than the buckets are "
                             f"kept ({ARRIVAL_TTL_S} s)")
        self.client, self.prefix, self.wall = client, prefix, wall
        self.bucket_s, self.lag_buckets, self.backfill_s = bucket_s, lag_buckets, backfill_s
        self._seen: dict[int, dict[str, int]] = {}  # bucket -> class -> counted so far
        self._next: int | None = None  # the newest bucket read by the last poll

    def poll(self) -> list[tuple[str, float, int]]:
        """What arrived since the last poll: (class, age s, count) per bucket and class."""
        now = self.wall()
        newest = bucket_of(now, self.bucket_s)
        start = (bucket_of(now - self.backfill_s, self.bucket_s) if self._next is None
                 else self._next - self.lag_buckets)
        buckets = list(range(start, newest + 1))
        pipe = self.client.pipeline(transaction=False)
        for b in buckets:  # and its TTL again: a producer's TTL may have been lost with
            key = arrivals_key(self.prefix, b)  # a transaction that failed
            pipe.hgetall(key)
            pipe.expire(key, ARRIVAL_TTL_S)
        out: list[tuple[str, float, int]] = []
        for b, raw in zip(buckets, pipe.execute()[::2], strict=True):
            seen = self._seen.setdefault(b, {})
            mid = (b + 0.5) * self.bucket_s
            for field, value in raw.items():
                cls = field.decode() if isinstance(field, bytes) else str(field)
                n = int(value) - seen.get(cls, 0)
                if n > 0:
                    out.append((cls, max(now - mid, 0.0), n))
                    seen[cls] = int(value)
        self._next = newest
        for b in [b for b in self._seen if b < newest - self.lag_buckets]:
            del self._seen[b]
        return out

