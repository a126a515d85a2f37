"""Interactive and batch on one cluster, with real workers: a flood of batch Dags (lowest
priority, no deadline) keeps two emulated GPUs busy for many seconds, and an interactive
Dag whose models are resident nowhere, sent with a deadline of three times its critical
path (its model loads included), is admitted and meets it; the flood still completes.
"""

from __future__ import annotations

import time

import pytest

from compass_celery import Dag
from compass_celery.errors import Rejected
from compass_celery.local import wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import emulated

pytestmark = pytest.mark.redis
BATCH, BATCH2, FIRST, SECOND = "bm", "bm2", "ia", "ib"
MODELS = {BATCH: 1500.0, BATCH2: 1500.0, FIRST: 1500.0, SECOND: 1500.0}  # 1 s loads
LOAD_MS = 1000.0
#: room for two models: the batch flood's two fill every worker from the start, so each
#: interactive model evicts one that queued batch work still needs
GPU = ["--compass-emulate-gpu-mb", "3200", "--compass-preload", f"{BATCH},{BATCH2}"]
BATCH_MS = 400.0  # each batch node
FLOOD = 30  # Dags of two nodes: 24 s of work, about 12 s of backlog on each worker
RUN_MS = 150.0  # each interactive node
CRITICAL_MS = LOAD_MS + RUN_MS + LOAD_MS + RUN_MS  # both models must load, one after other
DEADLINE_MS = 3 * CRITICAL_MS


@pytest.fixture
def two(compass_redis_url, compass_workers):
    app = emulated(compass_redis_url, compass_workers, MODELS, ["mix@one", "mix@two"], *GPU)
    yield app
    app.compass.close()


def _dag(app, name: str, first: tuple[str, float], second: tuple[str, float]) -> Dag:
    dag = Dag(app, name)
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    a = dag.node("a", infer.s(first[0], first[1], 0), model=first[0], exec_ms=first[1])
    dag.node("b", step.s(second[0], second[1]), after=[a], model=second[0],
             exec_ms=second[1])
    return dag


def _busy(app) -> list:
    return [w for w in app.compass.store.snapshot(time.time(), 3.0).workers
            if w.backlog_ms > 4 * BATCH_MS]


def test_an_interactive_dag_on_cold_models_meets_its_deadline_behind_a_batch_flood(two):
    app = two
    flood = [_dag(app, "nightly", (BATCH, BATCH_MS), (BATCH2, BATCH_MS)).apply_async(
        priority=0) for _ in range(FLOOD)]
    wait_until(lambda: len(_busy(app)) == 2, 10, "both workers holding a batch backlog")
    workers = app.compass.store.snapshot(time.time(), 3.0).workers
    assert all({BATCH, BATCH2} <= set(w.resident) for w in workers), workers  # full
    assert not any({FIRST, SECOND} & set(w.resident) for w in workers)  # resident nowhere
    sent = time.monotonic()
    try:
        job = _dag(app, "click", (FIRST, RUN_MS), (SECOND, RUN_MS)).apply_async(
            deadline_ms=DEADLINE_MS, priority=9)
    except Rejected as exc:
        backlog = {w.name: w.backlog_ms for w in _busy(app)}
        raise AssertionError(f"refused behind the flood ({backlog}): {exc} "
                             f"[{exc.cause}]") from None
    job.get(timeout=DEADLINE_MS / 1000 + 10)
    took_ms = (time.monotonic() - sent) * 1000
    print(f"interactive Dag answered in {took_ms:.0f} ms (deadline {DEADLINE_MS:.0f} ms, "
          f"critical path {CRITICAL_MS:.0f} ms)")
    assert took_ms < DEADLINE_MS, (took_ms, worker_logs(app.workers))
    assert _busy(app), "the flood drained before the interactive Dag ran: not a test"
    for handle in flood:  # batch work is not shed or lost: every job completes
        handle.get(timeout=60)


LONG_MS, FIRST_MS, NEXT_MS = 800.0, 300.0, 50.0
SLACK_MS = 10_000.0  # a deadline every one of them meets in any order: admitted, not shed


@pytest.fixture
def one(compass_redis_url, compass_workers):
    app = emulated(compass_redis_url, compass_workers, MODELS, ["order@one"],
                   "--compass-emulate-gpu-mb", "3200", "--compass-preload", f"{FIRST},{SECOND}")
    yield app
    app.compass.close()


def test_a_jobs_next_step_runs_ahead_of_new_first_steps_at_its_level(one):
    """An urgent Dag's second step, released while three new urgent Dags' first steps wait
    on the same worker, runs before them: its job has spent most of its time already (the
    worker core's rule, which the simulator runs too)."""
    app = one
    older = _dag(app, "older", (FIRST, LONG_MS), (SECOND, NEXT_MS)).apply_async(
        priority=9, deadline_ms=SLACK_MS)
    wait_until(lambda: _running(app), 10, "the older Dag's first step running")
    newer = [_dag(app, f"newer{i}", (FIRST, FIRST_MS), (SECOND, NEXT_MS)).apply_async(
        priority=9, deadline_ms=SLACK_MS) for i in range(3)]
    for handle in (older, *newer):
        handle.get(timeout=20)
    step = older.placement()["b"]["started"]
    firsts = sorted(h.placement()["a"]["started"] for h in newer)
    assert step < firsts[0], (step - firsts[0], worker_logs(app.workers))


def _running(app) -> bool:
    return any(w.running for w in app.compass.store.snapshot(time.time(), 3.0).workers)
