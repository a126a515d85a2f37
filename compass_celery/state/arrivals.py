"""Job arrivals per SLO class, counted in Redis by whoever submits, read by an
autoscaler controller.

The rule (``planner.scaling``) sizes the fleet from each class's arrival rate. A
controller that runs beside the producers (another pod, another host) cannot see their
submissions in its own process; so each submission adds one to its class in the current
wall-clock bucket (:data:`ARRIVAL_BUCKET_S` wide). The buckets of one minute share a hash
(:data:`ARRIVAL_KEY_S`, field ``"<bucket>:<class>"``) expiring after :data:`ARRIVAL_TTL_S`:
60 keys an hour, not one per second (3,600), for the same counts. An admitted job's count
rides in the transaction that records its deadline (no extra round trip; the key shares
the cluster state's hash tag, so it stays in that step's slot on a Redis Cluster); a
refused job's is one pipelined HINCRBY on the refusal path; each comes with the minute's
EXPIRE, so a minute's hash goes an hour after its last write; the reader sets it again on
what it reads. :class:`ArrivalCounter` reads the buckets back and hands out only
what it has not seen, re-reading the last few buckets so that a producer whose clock or
write lags a little is still counted once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import keys

#: Seconds of wall clock one bucket covers (one hash field per bucket and class).
ARRIVAL_BUCKET_S = 1.0
#: Seconds of wall clock one hash (one Redis key) covers.
ARRIVAL_KEY_S = 60
#: Seconds a minute's hash is kept from its last write (or the reader's last read).
ARRIVAL_TTL_S = 3600
#: Buckets behind the newest that are read again at each poll (late writes, clock skew).
ARRIVAL_LAG_BUCKETS = 5


def bucket_of(t_s: float, bucket_s: float = ARRIVAL_BUCKET_S) -> int:
    """The bucket holding wall-clock time ``t_s``."""
    return int(t_s // bucket_s)


def key_of(bucket: int, bucket_s: float = ARRIVAL_BUCKET_S) -> int:
    """The minute (:data:`ARRIVAL_KEY_S`) whose hash holds bucket ``bucket``."""
    return int(bucket * bucket_s // ARRIVAL_KEY_S)


def arrivals_key(prefix: str, bucket: int, bucket_s: float = ARRIVAL_BUCKET_S) -> str:
    """The hash counting bucket ``bucket``'s arrivals per class (its minute's hash)."""
    return keys.key(keys.ARRIVALS, prefix, minute=str(key_of(bucket, bucket_s)))


def arrivals_field(bucket: int, cls: str) -> str:
    """The field counting class ``cls`` in bucket ``bucket``."""
    return f"{bucket}:{cls}"


def count_arrival(pipe: Any, prefix: str, cls: str, now_s: float | None = None,
                  bucket_s: float = ARRIVAL_BUCKET_S, ttl_s: int = ARRIVAL_TTL_S) -> None:
    """Queue one arrival of class ``cls`` on ``pipe`` (a pipeline or a client) and the
    minute's TTL with it, every time: a minute's hash is written only during its minute,
    so it expires ``ttl_s`` after its last write. Remembering in the process which
    minutes already have one would leave a hash without expiry wherever Redis lost the
    key meanwhile (a restart, a failover, another server under the same prefix)."""
    bucket = bucket_of(time.time() if now_s is None else now_s, bucket_s)
    key = arrivals_key(prefix, bucket, bucket_s)
    pipe.hincrby(key, arrivals_field(bucket, cls), 1)
    pipe.expire(key, ttl_s)


def count_refused_arrival(client: Any, prefix: str, cls: str) -> None:
    """One refused job's arrival, on its own pipeline (one round trip)."""
    pipe = client.pipeline(transaction=False)
    count_arrival(pipe, prefix, cls)
    pipe.execute()


class ArrivalCounter:
    """The controller's side: each :meth:`poll` returns the arrivals counted since the
    last one, as (class, age in seconds, count), the age from the middle of the stretch
    of their bucket that elapsed since the previous poll (:func:`arrival_span`). The
    first poll reads ``backfill_s`` back (a restarted controller starts from the rate
    the producers saw, not from nothing)."""

    def __init__(self, client: Any, prefix: str, *, backfill_s: float = 0.0,
                 bucket_s: float = ARRIVAL_BUCKET_S, lag_buckets: int = ARRIVAL_LAG_BUCKETS,
                 wall: Callable[[], float] = time.time) -> None:
        if not bucket_s > 0 or lag_buckets < 0 or backfill_s < 0:
            raise ValueError("bucket_s must be > 0, lag_buckets and backfill_s >= 0")
        if backfill_s > ARRIVAL_TTL_S - ARRIVAL_KEY_S:
            raise ValueError(f"backfill_s {backfill_s:g} is longer than every bucket is "
                             f"kept ({ARRIVAL_TTL_S - ARRIVAL_KEY_S} s: a minute's hash "
                             f"expires {ARRIVAL_TTL_S} s after its last write)")
        self.client, self.prefix, self.wall = client, prefix, wall
        self.bucket_s, self.lag_buckets, self.backfill_s = bucket_s, lag_buckets, backfill_s
        self._seen: dict[int, dict[str, int]] = {}  # bucket -> class -> counted so far
        self._next: int | None = None  # the newest bucket read by the last poll
        self._last: float | None = None  # the wall clock of the last poll

    def poll(self) -> list[tuple[str, float, int]]:
        """What arrived since the last poll: (class, age s, count) per bucket and class."""
        now = self.wall()
        newest = bucket_of(now, self.bucket_s)
        start = (bucket_of(now - self.backfill_s, self.bucket_s) if self._next is None
                 else self._next - self.lag_buckets)
        minutes = [keys.key(keys.ARRIVALS, self.prefix, minute=str(m))
                   for m in range(key_of(start, self.bucket_s),
                                  key_of(newest, self.bucket_s) + 1)]
        pipe = self.client.pipeline(transaction=False)
        for key in minutes:  # and its TTL again: a producer's TTL may have been lost
            pipe.hgetall(key)  # with a transaction that failed
            pipe.expire(key, ARRIVAL_TTL_S)
        counts: dict[int, dict[str, int]] = {}
        for raw in pipe.execute()[::2]:
            for field, value in raw.items():
                text = field.decode() if isinstance(field, bytes) else str(field)
                b_text, _, cls = text.partition(":")
                try:
                    b = int(b_text)
                except ValueError:
                    continue  # not a count this reader wrote the format of
                if start <= b <= newest:
                    counts.setdefault(b, {})[cls] = int(value)
        out: list[tuple[str, float, int]] = []
        for b in sorted(counts):
            seen = self._seen.setdefault(b, {})
            lo, hi = arrival_span(b, self.bucket_s, self._last, now)
            for cls, value in counts[b].items():
                n = value - seen.get(cls, 0)
                if n > 0:
                    out.append((cls, now - (lo + hi) / 2.0, n))
                    seen[cls] = value
        self._next, self._last = newest, now
        for b in [b for b in self._seen if b < newest - self.lag_buckets]:
            del self._seen[b]
        return out


def arrival_span(bucket: int, bucket_s: float, last: float | None, now: float
                 ) -> tuple[float, float]:
    """The wall-clock stretch in which the arrivals newly counted in ``bucket`` came:
    the part of the bucket after the previous poll (``last``) and up to ``now``.

    Placing them at the bucket's middle instead biased a reading by the bucket edges'
    phase against the polls: a poll in the second half of its bucket put that bucket's
    first part at the middle, already past, so the last seconds held only part of a
    bucket's arrivals; a poll in the first half held up to half a bucket more. With
    polls every 3 s, a 6 s stretch read 5.5 to 6.5 s of arrivals as 6, and the up-fast
    test (the last eighth of the rate window) fired or not by that phase alone (the
    real controller held 3 workers where its simulation went to 4:
    docs/results/autoscale-real-2.txt). Split at the polls, each stretch ends where a
    poll was: a window whose edges fall on polls counts exactly what arrived in it. A
    count that lands in a bucket wholly before the previous poll (a producer's late
    write) is placed over its whole bucket."""
    start, end = bucket * bucket_s, (bucket + 1) * bucket_s
    lo = start if last is None or last >= end else max(start, last)
    return lo, max(min(end, now), lo)
