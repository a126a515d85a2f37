"""A Compass app's producer keeps its snapshot fresh between decisions, against a real
Redis: the reads run in the reader's thread, which also builds the planner's view of each
snapshot, so the next enqueue neither reads nor rebuilds; a worker's runtime does not."""

from __future__ import annotations

import threading
import time

import pytest

from compass_celery import placement
from compass_celery.emulated import EDGE_MODELS, make_app
from compass_celery.needs import TaskNeeds
from compass_celery.planner.types import WorkerView
from compass_celery.state import views
from compass_celery.worker.runtime import WorkerRuntime

pytestmark = pytest.mark.redis


def _view(name: str, resident: frozenset[str] = frozenset()) -> WorkerView:
    return WorkerView(name=name, queue="compass.w." + name, gpu_total_mb=16000.0,
                      gpu_free_mb=16000.0, resident=resident, heartbeat=1.0)


def test_an_app_in_use_reads_and_prepares_between_decisions(compass_redis_url):
    app = make_app(compass_redis_url)
    c = app.compass
    assert c.settings["snapshot_keep_fresh_s"] == 1.0  # on by default for producers
    c.store.publish(_view("a"))
    reader = c.reader
    model = sorted(EDGE_MODELS)[0]
    needs = TaskNeeds(task="t", model=model, exec_ms=40.0, output_kb=0.0,
                    exec_source="declared")

    def enqueue() -> placement.Decision:
        return placement.decide(needs, reader.get(), c.policy, c.model_sizes(),
                                c.shared_queue)

    assert enqueue().worker == "a"  # the first decision reads, in this thread
    c.store.publish(_view("b", resident=frozenset({model})))  # holds the model: better
    time.sleep(0.4)  # longer than the TTL and the read-ahead together
    assert reader.background_reads >= 2
    snap = reader.get()
    assert time.time() - snap.taken_at <= 0.1  # fresh
    assert views._VIEWS._last[0] is snap.workers  # its view already built
    assert enqueue().worker == "b"  # the change is seen without this thread reading
    assert reader.reads - reader.background_reads == 1
    assert any(t.name == "compass-snapshot" and t.is_alive()
               for t in threading.enumerate())  # the reader's own thread did the reads


@pytest.mark.parametrize("reader_first", [False, True])
def test_a_workers_reader_does_not_keep_fresh(compass_redis_url, reader_first):
    app = make_app(compass_redis_url)
    if reader_first:  # made as a producer's, before the worker's runtime
        assert app.compass.reader.prepare is not None
    WorkerRuntime(app.compass, "w@test", "compass.w.w@test")
    assert app.compass.reader.keep_fresh_s == 0.0
    assert app.compass.reader.refresh_ahead_s == 0.0
    assert app.compass.reader.prepare is None  # a successor's re-check builds no view
