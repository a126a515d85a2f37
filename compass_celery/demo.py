"""``compass-celery demo``: a private cluster of emulated GPUs, a burst, a table of why.

Everything it starts (redis-server, worker processes) is stopped on the way
out, also on Ctrl-C or an error.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from typing import Any

from .local import RedisServer, WorkerProcess, wait_until

#: What each demo worker holds at start: different models, so placement matters, and on
#: the default four workers two of the six models (translator, classifier) are resident
#: nowhere, so the burst shows compass weighing a model load against a queue wait.
PRELOADS = ["captioner", "detector", "ocr", "embedder", "captioner", "detector", "translator",
            "classifier"]
TASKS = ["caption", "detect", "translate", "embed", "classify", "ocr"]


def run_demo(redis_url: str | None, n_workers: int, n_tasks: int,
             echo: Callable[[str], Any] = print, seed: int = 7, side_by_side_jobs: int = 150,
             plot_path: str | None = "compass-demo.png") -> int:
    """Route a burst on emulated workers, print where each went and why, then side by side
    (on the Redis given, else on the benchmark's own private one, whose CPU its host line
    counts)."""
    given = redis_url
    with contextlib.ExitStack() as stack:
        if redis_url is None:
            server = stack.enter_context(RedisServer())
            redis_url = server.url
            echo(f"started a private redis-server at {redis_url}")
        env = {"COMPASS_BROKER_URL": redis_url, "COMPASS_KEY_PREFIX": "compass-demo"}
        saved = {k: os.environ.get(k) for k in env}  # put back on the way out: the caller's
        stack.callback(_restore_environ, saved)     # process (a test run, say) goes on
        os.environ.update(env)
        from .emulated import make_app

        app = make_app(redis_url, compass_key_prefix="compass-demo", compass_snapshot_ttl_s=0.0)
        workers = []
        for i in range(n_workers):
            w = WorkerProcess("compass_celery.emulated_app", f"gpu{i}@demo",
                              ["--compass-emulate-gpu-mb", "1600", "--compass-preload",
                               PRELOADS[i]], env=env)
            stack.callback(w.stop)
            workers.append(w.start())
        echo(f"starting {n_workers} emulated-GPU workers (1600 MB each, 1500 MB/s loads) ...")
        try:
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 5.0).workers)
                       == n_workers, 60, "the demo workers to publish their state")
        except TimeoutError:
            for w in workers:
                echo(f"--- {w.name} log ---\n{w.log()[-2000:]}")
            raise
        snap = app.compass.store.snapshot(time.time(), 5.0)
        echo("\nworkers (published in Redis):")
        for w in snap.workers:
            echo(f"  {w.name:<10} holds {', '.join(sorted(w.resident)):<24} "
                 f"free {w.gpu_free_mb:.0f} MB")
        rng = random.Random(seed)
        results = []
        for _ in range(n_tasks):
            name = rng.choice(TASKS)
            results.append((name, app.tasks[f"emulated.{name}"].delay(name)))
        echo(f"\nsent a burst of {n_tasks} tasks; policy: {app.compass.policy.name}\n")
        rows = []
        for name, res in results:
            out = res.get(timeout=120)
            d = app.compass.placement(res.id)
            rows.append([name, d.model, d.worker, out["worker"], f"{d.wait_ms:.0f}",
                         f"{d.load_ms:.0f}", f"{d.run_ms:.0f}", f"{d.est_finish_ms:.0f}",
                         d.reason])
        from .tables import text_table

        echo(text_table(rows, ["task", "model", "placed on", "ran on", "wait ms", "load ms",
                           "run ms", "est. finish", "why"]))
        moved = sum(1 for r in rows if r[2] != r[3])
        echo(f"\n{len(rows)} tasks done; {moved} ran somewhere other than planned. "
             "Times are emulated GPU timings in workload ms: what a real GPU of this size "
             "and load bandwidth would take.")
        for w in workers:
            w.stop()
        if side_by_side_jobs:
            side_by_side(given, side_by_side_jobs, plot_path, echo)
        echo("shutting down workers and redis ...")
    return 0


def _restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def side_by_side(redis_url: str | None, jobs: int, plot_path: str | None,
                 echo: Callable[[str], Any]) -> dict[str, Any]:
    """Plain Celery (shared queue, LRU caches) against Compass on the same job stream."""
    from .bench.runner import BenchOptions, run_bench
    from .tables import result_table
    from .workload import load_workload
    from .workloads import path as workload_path

    workload = load_workload(workload_path("edge-vision.json"))
    echo(f"\nside by side: {jobs} edge-vision jobs (3 ML pipelines, 6 models, 4 GPUs of "
         "1600 MB) under plain Celery and under Compass ...")
    echo("(time scale 0.5: the emulated GPUs sleep half of each workload millisecond, so the "
         "run takes half as long; every time shown is in workload ms)")
    opts = BenchOptions(policies=["celery-default", "compass"], jobs=jobs, time_scale=0.5,
                        redis_url=redis_url)
    result = run_bench(workload, opts, echo)
    echo("\n" + result_table(result))
    base, comp = (result["policies"][p]["latency_ms"] for p in ("celery-default", "compass"))
    echo(f"\ncompass: mean job latency {base['mean'] / max(comp['mean'], 1e-9):.1f}x lower, "
         f"p99 {base['p99'] / max(comp['p99'], 1e-9):.1f}x lower than plain Celery "
         "(emulated GPU timings, workload ms).")
    if plot_path:
        try:
            from .bench.plot import plot_result

            plot_result(result, plot_path)
            echo(f"plot: {os.path.abspath(plot_path)}")
        except RuntimeError as exc:
            echo(f"(no plot: {exc})")
    return result
