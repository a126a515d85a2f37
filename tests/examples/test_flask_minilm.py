"""The MiniLM web app (``examples/flask_minilm/``), eager: Flask's test client POSTs to
``/embed`` (the batched task) and ``/search`` (a two-node job) with the packaged MiniLM run
in process and no Redis; its load driver's table is checked on canned answers."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from compass_celery.testing import add_worker

from .helpers import DEAD_REDIS, ROOT, needs_real_models

pytest.importorskip("flask")
MINILM_DIR = ROOT / "examples" / "flask_minilm"
if str(MINILM_DIR) not in sys.path:
    sys.path.insert(0, str(MINILM_DIR))


@pytest.fixture(scope="module")
def client() -> Any:
    """The example's Flask app on an eager Celery app with one in-process CPU worker."""
    needs_real_models()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REDIS_URL", DEAD_REDIS)
        import minilm_web
    celery_app = minilm_web.celery_app
    celery_app.conf.task_always_eager = True
    add_worker(celery_app, "cpu0", gpu_mb=200)
    return minilm_web.app.test_client()


def test_embed_answers_a_unit_vector_per_text(client: Any) -> None:
    vectors = []
    for text in ("a cat sleeps on the sofa", "a kitten naps on the couch", "stock markets"):
        res = client.post("/embed", json={"text": text})
        assert res.status_code == 200, res.json
        vectors.append(res.json["embedding"])
    assert all(len(v) == 384 for v in vectors)
    assert abs(sum(x * x for x in vectors[0]) - 1.0) < 1e-3
    dot = [sum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors[1:]]
    assert dot[0] > dot[1] + 0.3, dot  # the kitten is nearer the cat than the markets


def test_search_ranks_the_documents(client: Any) -> None:
    res = client.post("/search", json={"query": "when is the budget meeting"})
    assert res.status_code == 200, res.json
    hits = res.json["hits"]
    assert len(hits) == 3 and "budget" in hits[0]["text"] and "budget" in hits[1]["text"]
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]


@pytest.mark.parametrize("path, body", [("/embed", {}), ("/embed", {"text": ""}),
                                        ("/search", {"query": "x" * 501}),
                                        ("/search", ["a list"])])
def test_bad_bodies_are_refused(client: Any, path: str, body: Any) -> None:
    res = client.post(path, json=body)
    assert res.status_code == 400
    assert "at most 500 characters" in res.json["error"]


def test_the_load_table_counts_each_outcome() -> None:
    import loadgen

    got = [(200, 0.1)] * 6 + [(200, 0.5), (429, 0.01), (504, 0.45), (0, 30.0)]
    fields = loadgen.row("/embed", got, [0.02, 0.03, 0.05]).split()
    assert fields[:6] == ["/embed", "6/10", "1", "1", "1", "1"]
    assert fields[-3:] == ["2.0", "3.0", "5.0"]  # CPU ms a request, per process


@pytest.mark.redis
def test_the_load_check_runs_the_app_as_the_readme_starts_it(tmp_path: Any) -> None:
    """The load driver at a handful of requests: a private redis-server, two real CPU
    workers and ``flask run``; each endpoint answers, with the batched task and the Dag
    run on the workers."""
    needs_real_models()
    import loadgen

    outcomes = loadgen.run(5, 5.0, tmp_path)
    assert set(outcomes) == {"/embed", "/search"}
    for path, (got, cpu) in outcomes.items():
        codes = [code for code, _ in got]
        assert len(codes) == 5 and set(codes) <= {200, 429, 504}, (path, got)
        assert codes.count(200) >= 4, (path, got)  # 5 a second leaves room to spare
        assert cpu[0] + cpu[1] > 0, (path, cpu)  # the workers ran them, not the web process
