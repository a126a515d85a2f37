"""A job's failure: once, with its planned work released and its siblings revoked.

A node that fails after its retries, an output that cannot be stored and a
deadline that passes all end here; ``fail.lua`` makes the first caller the only
one that acts, and wakes every waiter.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from .. import ledger
from ..planner.types import SHARED
from ..state.connection import text
from ..state.scripts import register_script
from .keys import JobKeys, deadlines_key, planned_charge_ms

if TYPE_CHECKING:
    from ..context import CompassContext

logger = logging.getLogger("compass_celery.jobs")


def fail_job(c: CompassContext, job_id: str, error: dict[str, Any]) -> str:
    """Fail the job once (fail.lua), release its planned-but-unsent work, revoke its
    outstanding tasks; returns the job's state (``FAILURE`` only for the first caller)."""
    keys = JobKeys.of(c.settings.key_prefix, job_id)
    client = c.store.client
    fail = register_script(client, "fail")
    state = fail(keys=[keys.job, keys.done], args=[json.dumps(error),
                                                     int(c.settings.job_ttl_s)])
    state = text(state)
    if state != "FAILURE":
        return state
    forget_deadline(c, job_id)
    logger.warning("compass: job %s failed at %r: %s", job_id, error.get("node"),
                   error.get("exc"))
    plan_raw = client.hget(keys.job, "plan")
    done = {k.decode() for k in client.hkeys(keys.outputs)}
    sent = {k.decode(): v.decode().lstrip("?") for k, v in client.hgetall(keys.tasks).items()}
    left = {k.decode(): int(v) for k, v in client.hgetall(keys.left).items()}
    plan = json.loads(plan_raw or "{}")
    for node, count in left.items():  # planned successors that will never be sent
        p = plan.get(node)
        if count > 0 and p and p["worker"] != SHARED and node not in done:
            ledger.plan(c, p["worker"], planned_charge_ms(p), p.get("level"), -1)
    revoke = [t for n, t in sent.items() if n not in done and t != error.get("task_id")]
    if revoke:
        c.app.control.revoke(revoke)
    return state


def forget_deadline(c: CompassContext, job_id: str, pipe: Any = None) -> None:
    """Take an ended job out of the deadline set at once, so the set holds running jobs
    only (the sweep is then left with the overdue). Not in the script that ends the job:
    the set is in the cluster state's hash slot, the job's keys in the job's own, so on
    a Redis Cluster no one script may touch both. Lost (the worker dies first), the
    entry is swept at its deadline."""
    (pipe if pipe is not None else c.store.client).zrem(
        deadlines_key(c.settings.key_prefix), job_id)


def sweep_overdue(c: CompassContext, now: float, limit: int = 100) -> int:
    """Fail running jobs past their deadline, waited on or not, and forget ended ones:
    no job outlives its deadline unended, and its keys then expire with the TTL."""
    client = c.store.client
    key = deadlines_key(c.settings.key_prefix)
    failed = 0
    for raw in client.zrangebyscore(key, "-inf", now, start=0, num=limit):
        job_id = text(raw)
        state = fail_job(c, job_id, {"job": job_id, "node": None, "task": None,
                                     "worker": None, "exc_type": "JobTimeout",
                                     "exc": "job deadline passed before it finished"})
        failed += state == "FAILURE"
        client.zrem(key, job_id)
    return failed
