"""A worker learns what each task costs it between runs (its dispatch hop), publishes it,
and plans count it before every start on that worker (real worker, real Redis)."""

from __future__ import annotations

import json
import time

import pytest

from compass_celery.jobs.dag import Dag
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.emulated import one_emulated

pytestmark = pytest.mark.redis


def test_a_worker_publishes_its_hop_and_plans_count_it(compass_redis_url, compass_workers):
    app, w = one_emulated(compass_redis_url, compass_workers, "g0@hop", {"m": 100},
                          "--compass-emulate-gpu-mb", "1000", "--compass-preload", "m")

    def record():
        return app.compass.store.snapshot(time.time(), 5.0).workers[0]

    assert record().hop_ms == 0.0  # nothing ran yet: nothing learned, nothing claimed

    # six tasks at once: each after the first waits while the one ahead finishes
    sent = [app.signature("emulated.infer", args=("m", 40, None)).apply_async(
        compass={"model": "m", "exec_ms": 40}) for _ in range(6)]
    for r in sent:
        r.get(timeout=30)
    seen: list[float] = []

    def settled() -> float | None:  # the last gap's sample published: two reads agree
        seen.append(record().hop_ms)
        return seen[-1] if len(seen) > 1 and seen[-1] and seen[-1] == seen[-2] else None

    try:
        hop = wait_until(settled, 10, "a published hop", interval=0.3)
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    assert 0.0 < hop < 200.0, hop  # a few ms of bookkeeping and a fetch, not a run

    dag = Dag(app, "hop")
    dag.node("a", app.signature("emulated.infer", args=("m", 30, None)), model="m", exec_ms=30)
    dag.node("b", app.signature("emulated.step", args=("m", 30)), model="m", exec_ms=30,
             after=["a"])
    job = dag.apply_async()
    job.get(timeout=30)
    plan = json.loads(app.compass.store.client.hget(job.keys.job, "plan"))
    a, b = plan["a"], plan["b"]
    assert a["hop_ms"] == b["hop_ms"] == hop
    assert a["start_ms"] >= hop  # an idle worker still picks the message up first
    assert b["start_ms"] == pytest.approx(a["finish_ms"] + hop)  # then one hop per task
    assert b["finish_ms"] == pytest.approx(b["start_ms"] + b["run_ms"])
