"""A soak at CI scale: many jobs through real workers, Redis restarted in the middle, and
compass's state back to its TTL-bounded level afterwards (issue 23, part 6).

Sized for a 2-core CI machine (under a minute); ``COMPASS_SOAK_JOBS`` runs a longer one.
The Redis is private to the test (a free port, AOF on, so a restart keeps the jobs).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis

from compass_celery.errors import JobError
from compass_celery.jobs.dag import Dag
from compass_celery.jobs.keys import deadlines_key
from compass_celery.local import RedisServer, wait_until
from compass_celery.state import keys
from compass_celery.testing import worker_logs
from tests.support.cluster import start

pytestmark = pytest.mark.redis

JOBS = int(os.environ.get("COMPASS_SOAK_JOBS", "300"))
TTL_S = 8  # compass_job_ttl_s, on the workers and the producer
INPUT = "i" * 4096  # each job's own input, so its records weigh something
LEASES = keys.key(keys.LEASES, "compass")
DEADLINES = deadlines_key("compass")
WAVE = 25  # jobs submitted together, then waited on
TEST_LOG = {b"ran", b"execs"}  # the jobapp's run log, not compass's state


def _job(app: Any, i: int) -> Dag:
    """A chain, or a small diamond; every 50th job's source outlasts a lease renewal."""
    dag = Dag(app, f"soak{i % 3}")
    if i % 50 == 0:
        a = dag.node("a", app.tasks["j.wait"].s(INPUT, 1.2))
    else:
        a = dag.node("a", app.tasks["j.wait"].s(INPUT, 0.0))
    b = dag.node("b", app.tasks["j.add"].s("b"), after=[a])
    if i % 3 == 0:
        c = dag.node("c", app.tasks["j.add"].s("c"), after=[a])
        dag.node("d", app.tasks["j.collect"].s(), after=[b, c])
    return dag


def _end(handles: list[Any]) -> tuple[int, int]:
    """Wait for every job to end; -> (succeeded, failed)."""
    ok = failed = 0
    for h in handles:
        try:
            h.get(timeout=60)
            ok += 1
        except JobError as exc:
            failed += 1
            if failed < 3:  # the jobapp's own run log may meet the restart
                print(f"soak: {exc}"[:300])
    return ok, failed


def _compass_keys(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(count=1000)) - TEST_LOG


def test_soak_state_returns_to_the_ttl_bounded_level(compass_workers):
    with RedisServer(args=["--appendonly", "yes"]) as server:
        env = {"COMPASS_JOBAPP_JOB_TTL_S": str(TTL_S)}
        app, ws = start(server.url, compass_workers, ["s0@soak", "s1@soak"], timeout_s=3.0,
                        env=env, compass_job_ttl_s=TTL_S, compass_job_timeout_s=60)
        client = app.log
        seen: list[set[bytes]] = []

        def settled() -> set[bytes] | None:  # the workers' own keys: two reads agree
            seen.append(_compass_keys(client))
            return seen[-1] if len(seen) > 1 and seen[-1] == seen[-2] else None

        base_keys = wait_until(settled, 10, "the workers' keys to settle", interval=0.3)
        base_mb = client.info("memory")["used_memory"] / 2**20
        ok = failed = 0
        peak_mb = base_mb
        for wave in range(0, JOBS, WAVE):  # read as they end: a record lives TTL_S
            ran = client.llen("ran")
            handles = [_job(app, i).apply_async() for i in range(wave, min(wave + WAVE, JOBS))]
            peak_mb = max(peak_mb, client.info("memory")["used_memory"] / 2**20)
            if wave == JOBS // 2 // WAVE * WAVE:  # mid-run, with this wave in flight
                wait_until(lambda r=ran: client.llen("ran") >= r + WAVE // 2, 30,
                           "the wave to be under way")
                server.restart()  # SIGTERM: the AOF is flushed, and the jobs survive
            done = _end(handles)
            ok, failed = ok + done[0], failed + done[1]
        assert ok >= 0.95 * JOBS, (ok, failed, worker_logs(ws))
        # once the jobs have ended nothing of theirs stays listed: no deadline, no lease
        # a job ending while Redis restarts can lose its entry's removal: the overdue sweep
        # (workers, every few seconds) takes it at its deadline, compass_job_timeout_s (60)
        wait_until(lambda: client.zcard(DEADLINES) == 0, 80, "the deadline set to empty")
        wait_until(lambda: client.zcard(LEASES) == 0, 5, "the leases to go")
        client.delete(*TEST_LOG)

        def jobs_left() -> list[bytes]:
            return [k for k in _compass_keys(client) - base_keys if b":job:" in k]

        try:  # every job's records expire within their TTL of its end
            wait_until(lambda: not jobs_left(), TTL_S + 1.5, "the job records to expire")
        except TimeoutError:
            raise AssertionError(jobs_left()[:5]) from None
        left = _compass_keys(client) - base_keys
        # what stays a while is a submission's once-guards and the arrival counts (one
        # hash per minute of submissions, for an autoscaler), each with its own expiry;
        # the rest is per worker or per task kind (records, counters, bindings), never per job
        once = [k for k in left if b":once:" in k or b":arrivals:" in k]
        # -1: no expiry (a leak); -2: already expired since the listing, as it should
        assert all(client.ttl(k) != -1 for k in once), once[:5]
        unknown = sorted(k for k in left if b":once:" not in k and b":arrivals:" not in k)
        assert len(unknown) <= 10, unknown
        after_mb = client.info("memory")["used_memory"] / 2**20
        print(f"soak: {JOBS} jobs ({ok} ok, {failed} failed); keys {len(base_keys)} before, "
              f"{len(base_keys) + len(left)} after ({len(once)} once-guards); "
              f"used_memory {base_mb:.2f} MB before, {peak_mb:.2f} MB mid-run, "
              f"{after_mb:.2f} MB after")
        assert after_mb - base_mb < 1.5, (base_mb, peak_mb, after_mb)
        for w in ws:
            w.stop()
