"""A worker's heartbeat under load: its record's publisher, against a real Redis."""

from __future__ import annotations

import time

from celery import Celery

from compass_celery import Compass


def test_a_worker_woken_by_every_task_still_beats(compass_redis_url: str) -> None:
    """Task ends wake the publisher, which then publishes only a changed record; a worker
    that finishes tasks faster than its beat interval must still beat, or peers and
    producers would take it for dead while it works hardest."""
    import threading

    from compass_celery.worker.runtime import WorkerRuntime

    app = Celery("busy", broker="memory://", set_as_current=False)
    app.conf.update(compass_redis_url=compass_redis_url, compass_key_prefix="busy",
                    compass_emulate_gpu_mb=1000.0, compass_state_refresh_s=0.05)
    c = Compass(app)
    rt = WorkerRuntime(c, "w@busy", c.queue_for("w@busy"))
    rt.publisher.publish()
    stop = threading.Event()

    def task_ends() -> None:
        while not stop.is_set():
            rt.publisher.wake.set()  # as every task's end does
            time.sleep(0.002)

    threads = [threading.Thread(target=rt.publisher.loop, daemon=True),
               threading.Thread(target=task_ends, daemon=True)]
    for t in threads:
        t.start()
    try:
        seen = []
        end = time.time() + 1.5
        while time.time() < end:  # a negative check over a window: never missing
            time.sleep(0.1)  # between reads, while the wakes keep coming
            seen.append([w.name for w in c.store.snapshot(time.time(), 0.3).workers])
    finally:
        stop.set()
        rt._stopping.set()
        for t in threads:
            t.join(2)
    assert seen and all(names == ["w@busy"] for names in seen), seen  # live on every read
