"""The batched MiniLM task: one real forward pass over every text waiting for it, each
caller its own embedding, on a worker and in eager mode (a batch of one)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers", reason="needs the real extra: "
                    "pip install 'compass-celery[real]'")

from compass_celery.local import wait_until  # noqa: E402
from compass_celery.pretrained.app import EMBED_TEXT_TASK, make_app  # noqa: E402
from compass_celery.testing import worker_logs  # noqa: E402

CAT, KITTEN, STOCKS = "a cat sits on the mat", "a kitten is on the rug", \
    "stock markets fell today"


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _check(cat: list[float], kitten: list[float], stocks: list[float]) -> None:
    assert len(cat) == len(kitten) == len(stocks) == 384
    assert abs(_dot(cat, cat) - 1) < 1e-3  # unit length: the dot product is the cosine
    assert _dot(cat, kitten) > 0.5 > _dot(cat, stocks) + 0.3, (
        _dot(cat, kitten), _dot(cat, stocks))


@pytest.mark.redis
def test_texts_waiting_run_as_one_pass_and_each_gets_its_embedding(compass_redis_url,
                                                                    compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_TORCH_THREADS": "1"}
    w = compass_workers("compass_celery.pretrained.worker", "emb@batch", "--compass-gpu",
                        "cpu", "--compass-device-mb", "150", env=env)
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5.0).workers) == 1,
                   60, "the worker's record")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    embed = app.tasks[EMBED_TEXT_TASK]
    # the first loads MiniLM (hundreds of ms) while the others queue up behind it
    texts = [CAT, KITTEN, STOCKS, CAT, KITTEN, STOCKS]
    results = [embed.delay(t) for t in texts]
    vectors = [r.get(timeout=60) for r in results]
    _check(*vectors[:3])
    assert vectors[3:] == vectors[:3]  # each input's own result, in its own place
    stats = wait_until(lambda: app.control.inspect(destination=["emb@batch"],
                                                   timeout=2.0).stats(), 20, "a stats reply")
    sizes = {int(n): int(k) for n, k in (p.split(" x") for p in
                                          stats["emb@batch"]["compass_batches"].split(", "))}
    assert sum(n * k for n, k in sizes.items()) == 6 and max(sizes) > 1, sizes


def test_in_eager_mode_each_call_is_a_batch_of_one_on_the_cpu():
    from compass_celery.testing import add_worker

    app = make_app("redis://127.0.0.1:1/0", task_always_eager=True)
    add_worker(app, "cpu0", gpu_mb=16000, resident=["minilm"])
    embed = app.tasks[EMBED_TEXT_TASK]
    _check(*(embed.delay(t).get() for t in (CAT, KITTEN, STOCKS)))
