"""How long after one producer plans a model load another producer's view shows it.

A real redis-server, two emulated-GPU workers (``compass_celery.emulated_app``, 1,600 MB,
loads at 1,000 MB/s) and two producer processes. Producer B polls two readers every 2 ms,
each with its own store (default snapshot cache): one folds the planned loads every
producer publishes (as compass does), one reads the workers' records only (as before).
Producer A sends, in turn, a task for a model no worker holds (the workers' caches evict
to make room) and notes when it decided and where. Per trial, the lag is from A's
decision to the first moment each of B's readers shows the model on that worker (loading
or resident).

    python docs/results/planned-loads/lag.py [TRIALS]
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time

MODELS = ["captioner", "ocr", "embedder", "translator"]


def watcher(url: str, stop: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """Producer B: first-seen times of (worker, model), by reader."""
    from compass_celery.emulated import make_app

    apps = {kind: make_app(url, compass_key_prefix="lag", compass_heartbeat_timeout_s=30)
            for kind in ("published", "records")}
    apps["records"].compass.reader.fold = None
    seen: dict[str, dict[str, float]] = {"published": {}, "records": {}}
    shown: dict[str, set[str]] = {"published": set(), "records": set()}
    while not stop.is_set():
        for kind, app in apps.items():
            now = time.time()
            here = {f"{w.name}|{m}" for w in app.compass.reader.get().workers
                    for m in (*w.resident, *w.loading)}
            for key in here - shown[kind]:
                seen[kind].setdefault(key, []).append(now)  # type: ignore[attr-defined]
            shown[kind] = here
        time.sleep(0.002)
    out.put(seen)


def main(trials: int) -> None:
    from compass_celery.emulated import make_app
    from compass_celery.local import RedisServer, WorkerProcess, wait_until

    with RedisServer() as server:
        env = {"COMPASS_BROKER_URL": server.url, "COMPASS_KEY_PREFIX": "lag",
               "COMPASS_HEARTBEAT_TIMEOUT_S": "30"}
        workers = [WorkerProcess("compass_celery.emulated_app", f"w{i}@lag",
                                 ["--compass-emulate-gpu-mb", "1600",
                                  "--compass-load-mb-per-s", "1000"], env=env).start()
                   for i in range(2)]
        try:
            app = make_app(server.url, compass_key_prefix="lag",
                           compass_heartbeat_timeout_s=30)
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 30).workers) == 2,
                       60, "two workers")
            stop, out = mp.Event(), mp.Queue()
            b = mp.get_context("fork").Process(target=watcher, args=(server.url, stop, out))
            b.start()
            time.sleep(1.0)
            infer = app.tasks["emulated.infer"]
            sent = []
            for k in range(trials):
                # both workers busy for 1.5 s with a model of their own, then a task for a
                # model neither holds: it waits, and its load is planned behind the run
                busy = [infer.apply_async(("detector", 1500, None), compass={
                    "model": "detector", "exec_ms": 1500}) for _ in range(2)]
                model = MODELS[k % len(MODELS)]
                r = infer.apply_async((model, 200, None),
                                      compass={"model": model, "exec_ms": 200})
                d = app.compass.placement(r.id)
                sent.append((time.time(), d.worker, model, r))
                for x in (*busy, r):
                    x.get(timeout=30)
                for w in workers:  # cold again: each trial's model is new to its worker
                    w.stop()
                    w.start()
                wait_until(lambda: len(app.compass.store.snapshot(time.time(), 30).workers)
                           == 2, 60, "two workers")
            stop.set()
            seen = out.get(timeout=30)
            b.join(10)
        finally:
            for w in workers:
                w.stop()
    report(sent, seen)


def report(sent: list, seen: dict) -> None:
    lags: dict[str, list[float]] = {"published": [], "records": []}
    for at, worker, model, _ in sent:
        for kind in lags:
            after = [t for t in seen[kind].get(f"{worker}|{model}", []) if t >= at - 0.01]
            if after:
                lags[kind].append(1000 * (min(after) - at))
    print(f"trials: {len(sent)}; lag from producer A's decision to producer B's view (ms)")
    for kind, ms in lags.items():
        ms.sort()
        print(f"  {kind:9s}: n {len(ms)}, median {statistics.median(ms):7.1f}, "
              f"p90 {ms[int(0.9 * (len(ms) - 1))]:7.1f}, max {ms[-1]:7.1f}")
    print(json.dumps({k: [round(v, 1) for v in ms] for k, ms in lags.items()}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 24)
