"""``compass-celery demo --real``: two CPU workers run real pretrained models through their
model caches; a voice search goes through Redis, and the ranking and the placement print.

Everything it starts (redis-server, worker processes) is stopped on the way out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ..local import RedisServer, WorkerProcess, wait_until
from ..tables import text_table

QUERIES = ("when is the budget meeting", "the cat broke a glass")


def run_real_demo(redis_url: str | None, echo: Callable[[str], Any] = print,
                  n_workers: int = 2, budget_mb: float = 200.0) -> int:
    """Start the cluster, run one voice search per query, print what came back."""
    from .app import make_app, voice_search

    with contextlib.ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(RedisServer()).url
            echo(f"started a private redis-server at {redis_url}")
        env = {"COMPASS_BROKER_URL": redis_url, "COMPASS_KEY_PREFIX": "compass-real-demo",
               "COMPASS_TORCH_THREADS": "1"}
        workers = []
        for i in range(n_workers):
            w = WorkerProcess("compass_celery.pretrained.worker", f"cpu{i}@demo",
                              ["--compass-gpu", "cpu", "--compass-device-mb", str(budget_mb)],
                              env=env)
            stack.callback(w.stop)
            workers.append(w.start())
        echo(f"starting {n_workers} CPU workers, {budget_mb:.0f} MB of models each, running "
             "all-MiniLM-L6-v2 (91 MB) and Silero VAD (2 MB) ...")
        app = make_app(redis_url, compass_key_prefix="compass-real-demo",
                       compass_snapshot_ttl_s=0.0)
        try:
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5.0).workers)
                       == n_workers, 90, "the workers to publish their state")
        except TimeoutError:
            for w in workers:
                echo(f"--- {w.name} log ---\n{w.log()[-2000:]}")
            raise
        for query in QUERIES:
            job = voice_search(app, query).apply_async()
            _show(query, job.get(timeout=120)["rank"], job.placement(), echo)
        echo("shutting down workers and redis ...")
    return 0


def _show(query: str, rank: dict[str, Any], where: dict[str, dict[str, Any]],
          echo: Callable[[str], Any]) -> None:
    echo(f"\nquery: {query!r}")
    spans = ", ".join(f"{s['start']:.1f}-{s['end']:.1f} s" for s in rank["speech"])
    echo(f"speech found at {spans}")
    echo(text_table([[f"{h['score']:.3f}", f"{h['start']:.1f}-{h['end']:.1f} s", h["text"]]
                     for h in rank["hits"]], ["score", "said at", "transcript line"]))
    for line in rank["not_spoken"]:
        echo(f"set aside (no speech there): {line['text']!r}")
    echo(text_table([[node, w.get("worker", "?"), f"{w.get('queued_ms', 0):.0f}",
                      f"{w.get('load_ms', 0):.0f}", f"{w.get('run_ms', 0):.0f}"]
                     for node, w in where.items()],
                    ["node", "ran on", "queued ms", "load ms", "run ms"]))
