"""A real ``workers.ml`` worker on cpu: real forward passes and an honest published record."""

from __future__ import annotations

import json
import time

import pytest
import redis

pytest.importorskip("torch")

from compass_celery.cache import ModelRegistry  # noqa: E402
from compass_celery.local import wait_until  # noqa: E402
from compass_celery.testing import worker_logs  # noqa: E402
from workers.ml import make_app  # noqa: E402
from workers.models import VOCAB, forward, register_example_models, translate  # noqa: E402

pytestmark = pytest.mark.redis

NAME = "ml-cpu@test"
PIXELS = [((i * 37) % 255) / 255 for i in range(3 * 32 * 32)]
TOKENS = [5, 17, 42, 311, 7000, 9]


def test_cpu_worker_runs_real_models_and_counts_each_task_once(compass_redis_url,
                                                               compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_STATE_REFRESH_S": "0.1"}
    w = compass_workers("workers.ml", NAME, "--compass-gpu", "cpu",
                        "--compass-preload", "image-classifier", env=env)
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0)
    client = redis.Redis.from_url(compass_redis_url)

    def live():
        snap = app.compass.store.snapshot(time.time(), 5.0)
        return snap.workers or None

    try:
        (view,) = wait_until(live, 25, "the ml worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    assert view.name == NAME and view.device == "cpu"
    assert set(view.resident) == {"image-classifier"}  # preloaded before the first task

    # one after the other: sent together, the translator would be prefetched while
    # classify runs and its task would count a hit, not a miss
    res_c = app.tasks["ml.classify"].delay(PIXELS, 3)
    out_c = res_c.get(timeout=20)
    res_t = app.tasks["ml.translate"].delay(TOKENS, 8)
    out_t = res_t.get(timeout=20)
    assert app.compass.placement(res_c.id).worker == NAME, worker_logs([w])
    assert app.compass.placement(res_c.id).load_ms == 0  # resident: no load charged

    # well-formed outputs of real forward passes on the worker's cpu
    assert out_c["model"] == "image-classifier" and out_t["model"] == "translator"
    assert out_c["worker"] == out_t["worker"] == NAME
    assert out_c["device"] == out_t["device"] == "cpu"
    labels, scores = out_c["output"]["labels"], out_c["output"]["scores"]
    assert len(labels) == len(scores) == 3 and all(0 <= i < 1000 for i in labels)
    assert scores == sorted(scores, reverse=True) and all(0 < s <= 1 for s in scores)
    tokens = out_t["output"]
    assert 1 <= len(tokens) <= 8 and all(isinstance(t, int) and 0 <= t < VOCAB for t in tokens)
    assert out_c["forward_ms"] > 0 and out_t["forward_ms"] > 0

    # seeded weights: the worker's answers are exactly those of the same models here
    reg = ModelRegistry()
    register_example_models(reg)
    assert out_c["output"] == forward("image-classifier", reg.get("image-classifier").loader(),
                                      PIXELS)
    assert tokens == translate(reg.get("translator").loader(), TOKENS, max_len=8)

    # the published record: both models resident, one access per task (classify hit the
    # preloaded model, translate missed and loaded); before the get_model fix: (3, 1, 2)
    # counters live beside the record (worker-stats), so they never change its bytes
    def counters():
        raw = client.hget("{compass}:worker-stats", NAME)
        stats = json.loads(raw) if raw else {}
        return stats if stats.get("hits", 0) + stats.get("misses", 0) >= 2 else None

    stats = wait_until(counters, 10, "the worker's counters after two tasks")
    assert (stats["hits"], stats["misses"], stats["loads"]) == (1, 1, 2), stats
    # what compass's own handlers cost the two tasks, the translator's load left out
    def handled():
        stats = json.loads(client.hget("{compass}:worker-stats", NAME))
        return stats if stats.get("tasks") == 2 else None

    stats = wait_until(handled, 10, "both tasks counted")
    # a few ms in all; with the load counted it would be some 250 ms
    assert 0 < stats["compass_cpu_ms"] < 50, stats
    per_task = app.control.inspect(destination=[NAME], timeout=5).stats()[NAME]
    assert 0 < per_task["compass_cpu_ms_per_task"] < 25, per_task
    rec = json.loads(client.hget("{compass}:workers", NAME))
    assert {"image-classifier", "translator"} <= set(rec["resident"]), rec
    assert rec["device"] == "cpu" and "hits" not in rec
