"""A producer folds the model loads it plans into the snapshot it plans on (real
redis-server, real worker processes): the next decision before the next read sees the
model on its way to the worker, with its memory taken."""

from __future__ import annotations

import pytest

from compass_celery.testing import worker_logs
from tests.app.test_routing import GPU, live_workers
from workers.emulated import make_app

pytestmark = pytest.mark.redis


def test_a_planned_load_shows_as_loading_until_the_next_read(compass_redis_url,
                                                             compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_HEARTBEAT_TIMEOUT_S": "1.5"}
    ws = [compass_workers("workers.emulated", "cap@test", *GPU, "--compass-preload",
                          "captioner", env=env),
          compass_workers("workers.emulated", "det@test", *GPU, "--compass-preload",
                          "detector,translator", env=env)]
    # a long-lived snapshot: every decision below plans on the one read
    app = make_app(compass_redis_url, compass_heartbeat_timeout_s=1.5,
                   compass_snapshot_ttl_s=30, compass_snapshot_keep_fresh_s=0)
    live_workers(app, 2, workers=ws)
    caption = app.tasks["emulated.caption"]
    results, placements = [], []
    for i in range(12):  # cap@test's backlog grows until the idle det@test wins
        results.append(caption.delay(i))
        placements.append(app.compass.placement(results[-1].id))
        if placements[-1].worker == "det@test":
            break
    first = placements[-1]
    assert first.worker == "det@test" and first.load_ms > 0, placements
    det = {w.name: w for w in app.compass.reader.get().workers}["det@test"]
    assert "captioner" in det.loading and "captioner" not in det.resident
    began, ends = det.loading["captioner"]
    assert ends > began  # until the task's planned start, on the reader's wall clock
    assert det.gpu_free_mb == pytest.approx(1600 - 250 - 300 - 950, abs=1.0)
    # the next caption task there waits for that load rather than loading it again
    nxt = caption.delay("more")
    placed = app.compass.placement(nxt.id)
    if placed.worker == "det@test":
        assert placed.load_ms < first.load_ms
    for r in [*results, nxt]:
        assert r.get(timeout=30)["worker"] in ("cap@test", "det@test"), worker_logs(ws)


def test_a_dag_submission_folds_the_loads_its_plan_makes(compass_redis_url, compass_workers):
    from compass_celery import Dag

    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_HEARTBEAT_TIMEOUT_S": "1.5"}
    ws = [compass_workers("workers.emulated", "cap@test", *GPU, "--compass-preload",
                          "captioner", env=env)]
    app = make_app(compass_redis_url, compass_heartbeat_timeout_s=1.5,
                   compass_snapshot_ttl_s=30, compass_snapshot_keep_fresh_s=0)
    live_workers(app, 1, workers=ws)
    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    dag = Dag(app, "embed-then-ocr")
    a = dag.node("a", infer.s("embedder", 50.0, 0), model="embedder", exec_ms=50.0)
    dag.node("b", step.s("ocr", 50.0), after=[a], model="ocr", exec_ms=50.0)
    handle = dag.apply_async()
    cap = app.compass.reader.get().workers[0]
    # both loads are on their way in this producer's view: 1600 - 950 - 420 - 600 < 0, so
    # the captioner (no demand ranks it) goes to make room for the second
    assert set(cap.loading) == {"embedder", "ocr"}, cap
    assert "captioner" not in cap.resident and cap.gpu_free_mb >= 0
    assert cap.loading["ocr"][1] >= cap.loading["embedder"][1]  # in after the first
    handle.get(timeout=30)
