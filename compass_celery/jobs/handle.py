"""``JobHandle``: like an AsyncResult for a whole job, read from its Redis record."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import DeadlineMissed, JobError, JobFailed, JobTimeout
from .failure import fail_job
from .keys import JobKeys

if TYPE_CHECKING:
    from ..context import CompassContext


class JobHandle:
    """Like an AsyncResult for a whole job: ``get()``, ``status``, ``placement()``."""

    def __init__(self, compass: CompassContext, job_id: str) -> None:
        self.c, self.id = compass, job_id
        self.keys = JobKeys.of(compass.settings.key_prefix, job_id)

    @property
    def client(self) -> Any:
        """The state store's Redis client, which holds the job's record."""
        return self.c.store.client

    @property
    def status(self) -> str:
        """The job's state in its Redis record, or ``UNKNOWN`` once the record is gone."""
        state = self.client.hget(self.keys.job, "state")
        return state.decode() if state else "UNKNOWN"

    def ready(self) -> bool:
        """Whether the job has ended, in success or failure."""
        return self.status in ("SUCCESS", "FAILURE")

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends (or ``timeout``); fail it when its deadline passes."""
        return self._wait(timeout, ())[0]

    def _wait(self, timeout: float | None, also: tuple[str, ...], outputs: bool = False
              ) -> tuple[str, list[Any], list[Any] | None]:
        """:meth:`wait`, returning too the job fields ``also`` as read with the final state
        and, with ``outputs`` (``also`` then ends with ``sinks``), the sinks' raw outputs:
        the wake-up, the state and the outputs come in one round trip, on the path from
        the job's end to the caller (None when they were not read with it)."""
        deadline_raw, raw, *fields = self.client.hmget(self.keys.job,
                                                       ["deadline", "state", *also])
        if deadline_raw is None:
            raise JobError(f"job {self.id} is unknown or expired")
        deadline = float(deadline_raw)
        until = deadline if timeout is None else min(deadline, time.time() + timeout)
        sinks = json.loads(fields[-1]) if outputs and fields[-1] is not None else None
        out: list[Any] | None = None
        while True:
            state = raw.decode() if raw else "UNKNOWN"
            if state in ("SUCCESS", "FAILURE"):
                return state, fields, out
            if state == "UNKNOWN":
                raise JobError(f"job {self.id}: its record is gone from Redis (expired after "
                               "compass_job_ttl_s, or Redis restarted without persistence)")
            left = until - time.time()
            if left <= 0:
                if time.time() >= deadline:
                    fail_job(self.c, self.id, {"job": self.id, "node": None, "task": None,
                                               "worker": None, "exc_type": "JobTimeout",
                                               "exc": "job deadline passed"})
                    raw, *fields = self.client.hmget(self.keys.job, ["state", *also])
                    out = None
                    continue
                raise JobTimeout(f"job {self.id} not finished within {timeout}s "
                                 f"(state {state})")
            # rotate the list onto itself: wakes on the end, leaves it (and its TTL) for
            # other waiters instead of recreating the key without one
            pipe = self.client.pipeline(transaction=False)
            pipe.blmove(self.keys.done, self.keys.done, max(0.01, min(left, 1.0)),
                        "RIGHT", "LEFT")
            pipe.hmget(self.keys.job, ["state", *also])
            if sinks:
                pipe.hmget(self.keys.outputs, sinks)
            _, (raw, *fields), *more = pipe.execute()
            out = more[0] if more else None

    def get(self, timeout: float | None = None, propagate: bool = True) -> dict[str, Any]:
        """The sink results ``{node: result}``; raises JobFailed / JobTimeout."""
        state, (error_raw, sinks_raw), raw = self._wait(timeout, ("error", "sinks"), True)
        if state == "FAILURE":
            error = json.loads(error_raw or "{}")
            if propagate:
                raise (DeadlineMissed if error.get("exc_type") == "DeadlineMissed"
                       else JobFailed)(error)
            return {}
        if sinks_raw is not None:
            sinks = json.loads(sinks_raw)
        else:  # a job recorded before its sinks were (an older compass): from the nodes
            nodes = json.loads(self.client.hget(self.keys.job, "nodes"))
            sinks = [n for n, v in nodes.items() if not v["succs"]]
        if raw is None:  # ended before the wait: not read with its end
            raw = self.client.hmget(self.keys.outputs, sinks)
        return {n: json.loads(r) if r is not None else None for n, r in zip(sinks, raw,
                                                                             strict=True)}

    @property
    def error(self) -> dict[str, Any] | None:
        """A failed job's error record (node, task, worker, exception), else None."""
        raw = self.client.hget(self.keys.job, "error")
        return json.loads(raw) if raw else None

    def placement(self, readable: bool = False) -> dict[str, dict[str, Any]]:
        """Per node: planned worker, where it ran, whether it moved, its timings (``readable``:
        times as ISO 8601 in UTC and durations in whole ms, as a JSON API answers)."""
        plan = json.loads(self.client.hget(self.keys.job, "plan") or "{}")
        info = {k.decode(): json.loads(v) for k, v in self.client.hgetall(self.keys.info).items()}
        names, old = self.client.hmget(self.keys.job, ["names", "nodes"])
        nodes = json.loads(names or old or "[]")  # "nodes": a job recorded by an older compass
        out = {n: {"planned": (plan.get(n) or {}).get("worker"), **info.get(n, {}),
                   "moved": bool(info.get(n, {}).get("moved_from"))} for n in nodes}
        return {n: readable_timing(w) for n, w in out.items()} if readable else out

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}>"


def readable_timing(where: dict[str, Any]) -> dict[str, Any]:
    """One node's placement for people: ``started``/``finished`` as ISO 8601 (UTC, ms),
    every ``*_ms`` as a whole number of milliseconds; the rest as it is."""
    out: dict[str, Any] = {}
    for key, value in where.items():
        if key in ("started", "finished", "sent") and isinstance(value, (int, float)):
            out[key] = datetime.fromtimestamp(value, tz=UTC).isoformat(
                timespec="milliseconds")
        elif key.endswith("_ms") and isinstance(value, (int, float)):
            out[key] = round(value)
        else:
            out[key] = value
    return out
