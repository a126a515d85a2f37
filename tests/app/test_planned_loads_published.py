"""Every producer sees the model loads the others planned (a real redis-server, a second
producer in a process of its own): a load one producer plans is published with its
charges, and another's next read folds it in, by the rule the first folds its own by,
before the worker's record shows it (workers prefetch within a poll, so the workers here
are records that do not move: what is measured is what producers tell each other)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compass_celery.planner.types import WorkerView
from workers.emulated import make_app

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]

#: Producer B: its own app and Redis clients, in a process of its own; prints what its
#: snapshot says of each worker, folded (its reader) and as the records have it.
OTHER_PRODUCER = r'''
import json, sys, time
from workers.emulated import make_app
app = make_app(sys.argv[1], compass_key_prefix="pub", compass_heartbeat_timeout_s=3600)
views = {"folded": app.compass.reader.get().workers,
         "raw": app.compass.store.snapshot(time.time(), 3600).workers}
print(json.dumps({kind: {w.name: {"loading": sorted(w.loading), "free": w.gpu_free_mb}
                         for w in ws} for kind, ws in views.items()}))
'''


def _record(app, name: str, resident: frozenset[str], free: float) -> None:
    app.compass.store.publish(WorkerView(
        name=name, queue=app.compass.queue_for(name), gpu_total_mb=1600.0,
        gpu_free_mb=free, resident=resident, load_mb_per_s=500.0, heartbeat=time.time()))


def _other_producer(url: str) -> dict:
    out = subprocess.run([sys.executable, "-c", OTHER_PRODUCER, url], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_load_one_producer_plans_is_in_anothers_next_read(compass_redis_url):
    app = make_app(compass_redis_url, compass_key_prefix="pub",
                   compass_heartbeat_timeout_s=3600)
    _record(app, "busy", frozenset({"captioner"}), 650.0)
    app.compass.store.set_backlog("busy", 60_000.0)  # a minute of work: not worth waiting
    _record(app, "idle", frozenset(), 1600.0)
    before = _other_producer(compass_redis_url)
    assert before["folded"] == before["raw"]  # nothing planned yet: nothing folded
    caption = app.tasks["emulated.caption"]
    sent = caption.delay("first")
    placed = app.compass.placement(sent.id)
    assert placed.worker == "idle" and placed.load_ms > 0, placed
    app.compass.router.charges.flush()  # what the flusher sends within milliseconds
    seen = _other_producer(compass_redis_url)
    # the record does not show the load (its worker has not started it); the other
    # producer's read does, its memory taken, as this producer's own fold has it
    assert seen["raw"]["idle"] == {"loading": [], "free": 1600.0}
    assert seen["folded"]["idle"] == {"loading": ["captioner"], "free": 650.0}
    assert seen["folded"]["busy"] == seen["raw"]["busy"]
    mine = {w.name: w for w in app.compass.reader.get().workers}["idle"]
    assert sorted(mine.loading) == ["captioner"] and mine.gpu_free_mb == 650.0
    # once the worker's record has the model, the planned load folds to nothing more
    _record(app, "idle", frozenset({"captioner"}), 650.0)
    after = _other_producer(compass_redis_url)
    assert after["folded"]["idle"] == after["raw"]["idle"] == {"loading": [], "free": 650.0}
