"""Real pretrained weights end to end: two cpu workers run all-MiniLM-L6-v2 and Silero
VAD through their model caches, a voice-search job goes through Redis, and its answer is
checked against what is known about the clip and the sentences."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("sentence_transformers", reason="needs the real extra: "
                    "pip install 'compass-celery[real]'")
pytest.importorskip("silero_vad", reason="needs the real extra")

from compass_celery.local import wait_until  # noqa: E402
from compass_celery.pretrained import models as pm  # noqa: E402
from compass_celery.pretrained.app import make_app, voice_search  # noqa: E402
from compass_celery.pretrained.search import example_clip  # noqa: E402
from compass_celery.testing import worker_logs  # noqa: E402

pytestmark = pytest.mark.redis

#: Room for MiniLM (91 MB) and the VAD (2 MB), not for two MiniLM copies.
BUDGET_MB = "150"


def _cluster(compass_workers, url: str, n: int = 2) -> tuple[object, list]:
    env = {"COMPASS_BROKER_URL": url, "COMPASS_STATE_REFRESH_S": "0.1",
           "COMPASS_TORCH_THREADS": "1"}
    workers = [compass_workers("compass_celery.pretrained.worker", f"cpu{i}@real",
                               "--compass-gpu", "cpu", "--compass-device-mb", BUDGET_MB,
                               env=env) for i in range(n)]
    app = make_app(url, compass_snapshot_ttl_s=0)

    def live():
        return len(app.compass.store.snapshot(time.time(), 5.0).workers) == n or None

    try:
        wait_until(live, 60, "the pretrained workers' records")
    except TimeoutError:
        raise AssertionError(worker_logs(workers)) from None
    return app, workers


def test_voice_search_ranks_spoken_lines_with_real_models(compass_redis_url, compass_workers):
    app, workers = _cluster(compass_workers, compass_redis_url)
    job = voice_search(app, "when is the budget meeting").apply_async()
    out = job.get(timeout=90)["rank"]

    # Silero found the two spoken parts of the clip (1.5-4.0 s and 6.0-8.5 s) and nothing
    # in the hiss between them
    speech = out["speech"]
    assert len(speech) == 2, (speech, worker_logs(workers))
    assert abs(speech[0]["start"] - 1.5) < 0.3 and abs(speech[1]["start"] - 6.0) < 0.3
    assert all(not (4.5 < s["start"] < 5.9) for s in speech)
    # the line "heard" in the hiss is set aside, the spoken ones ranked: budget first
    assert [x["text"] for x in out["not_spoken"]] == ["thanks for watching, please subscribe"]
    hits = out["hits"]
    assert hits[0]["text"].startswith("the quarterly budget review")
    assert hits[0]["score"] > hits[1]["score"] + 0.2, hits
    assert out["models_were_resident"] is True  # each model was on the device as its task ran

    # each node ran on a live worker with its model resident: a model load is timed on the
    # worker before the body runs, and the body's get_model would fail without it
    where = job.placement()
    names = {w.name for w in workers}
    assert set(where) == {"speech", "query", "lines", "rank"}
    assert all(w["worker"] in names for w in where.values()), where
    assert all(w["run_ms"] > 0 for w in where.values())


def test_the_cache_held_each_model_its_task_needed(compass_redis_url, compass_workers):
    """Two jobs on two embedder copies that do not fit together: a worker evicts one to
    load the other, and every task still found its own model resident."""
    app, workers = _cluster(compass_workers, compass_redis_url, n=1)
    first = voice_search(app, "budget", embedder="minilm-a").apply_async()
    assert first.get(timeout=90)["rank"]["hits"][0]["text"].startswith("the quarterly")
    second = voice_search(app, "a cat and a glass", embedder="minilm-b").apply_async()
    top = second.get(timeout=90)["rank"]["hits"][0]["text"]
    assert top.startswith("the cat knocked"), worker_logs(workers)
    assert first.get()["rank"]["models_were_resident"] and second.get()["rank"][
        "models_were_resident"]
    client = app.compass.store.client
    raw = client.hget(f"{{{app.conf.compass_key_prefix}}}:worker-stats", workers[0].name)
    stats = json.loads(raw)
    assert stats["loads"] >= 3 and stats["evictions"] >= 1, stats  # vad, a, then b over a


def test_catalogue_sizes_are_what_the_models_measure():
    """The catalogue's sizes are measurements: loading the models again gives the same."""
    recorded = pm.measured_sizes()
    for name in ("minilm", "silero-vad"):
        now = pm.measure(name)
        assert now["resident_mb"] == pytest.approx(recorded[name]["resident_mb"], rel=0.01)
        assert now["file_mb"] == pytest.approx(recorded[name]["file_mb"], rel=0.01)
    assert pm.catalogue_mb()["minilm"] == pytest.approx(90.86, rel=0.01)


def test_voice_search_in_eager_mode_runs_the_real_models_without_redis():
    from compass_celery.testing import add_worker

    app = make_app("redis://127.0.0.1:1/0", task_always_eager=True)
    add_worker(app, "gpu0", gpu_mb=16000, resident=["minilm", "silero-vad"])
    out = voice_search(app, "please subscribe to the channel").apply_async().get()["rank"]
    # the best match for the query was "heard" in the hiss: set aside, not ranked
    assert [x["text"] for x in out["not_spoken"]] == ["thanks for watching, please subscribe"]
    assert len(out["hits"]) == 2 and all(h["score"] < 0.5 for h in out["hits"])


def test_a_measured_load_is_learned_per_model_and_planned_with(compass_redis_url,
                                                               compass_workers):
    """Silero VAD is 2 MB: size over bandwidth says a load takes a few ms, but reading
    the TorchScript file, building and warming it takes far longer. After one load the
    planner counts what was measured."""
    from compass_celery.state.views import cluster_view

    app, workers = _cluster(compass_workers, compass_redis_url, n=1)
    res = app.tasks["pretrained.speech"].delay(example_clip())
    assert len(res.get(timeout=60)["segments"]) == 2
    predicted = app.compass.placement(res.id).load_ms  # the decision: size over bandwidth
    snap = app.compass.store.snapshot(time.time(), 5.0)
    learned = cluster_view(snap, app.compass.model_sizes()).load_ms
    by_size = 2.181 / app.compass.settings["load_mb_per_s"] * 1000
    assert predicted == pytest.approx(by_size, rel=0.01)
    assert 20 < learned.get("silero-vad", 0) < 10_000, (learned, by_size)
    assert learned["silero-vad"] > 5 * by_size  # what the next placement counts
    # and it does: the next decision for the model on a worker without it counts it
    later = app.tasks["pretrained.speech"].apply_async((example_clip(),), compass={
        "model": "minilm"})  # another model: the 91 MB embedder, not yet loaded
    later.get(timeout=60)
    assert app.compass.placement(later.id).load_ms == pytest.approx(
        90.861 / app.compass.settings["load_mb_per_s"] * 1000, rel=0.01)  # not learned yet


def test_a_packaged_models_path_is_public_and_loads_from_a_str_or_a_path() -> None:
    from pathlib import Path

    from compass_celery.pretrained import load_sentence_transformer, model_path

    where = model_path("all-MiniLM-L6-v2")
    assert isinstance(where, str) and Path(where).is_dir()  # what SentenceTransformer takes
    assert model_path("minilm") == where and model_path("silero-vad").endswith(".jit")
    net = load_sentence_transformer(Path(where))  # a path object: refused by the library
    assert len(pm.embed(net, ["one sentence"])[0]) == 384
    with pytest.raises(KeyError, match="no packaged model 'MiniLM'.*all-MiniLM-L6-v2"):
        model_path("MiniLM")


def test_a_users_own_loader_leaves_no_progress_bar_in_the_worker_log(compass_redis_url,
                                                                      compass_workers):
    """A loader that builds the packaged MiniLM with sentence-transformers itself: its
    "Loading weights" bar went to the worker's stderr, which Celery logs as WARNING lines."""
    from tests.support.hf_app import make_app as hf_app

    w = compass_workers("tests.support.hf_app", "hf@cpu", "--compass-gpu", "cpu",
                        "--compass-preload", "user-minilm",
                        env={"COMPASS_BROKER_URL": compass_redis_url})
    app = hf_app(compass_redis_url)
    try:
        wait_until(lambda: any("user-minilm" in x.resident for x in
                               app.compass.store.snapshot(time.time(), 5.0).workers),
                   90, "the preloaded model")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    assert "Loading weights" not in w.log() and "it/s]" not in w.log(), w.log()[-3000:]
