"""The hot path with the atomic fetch on and off, alternated on one Redis.

``compass-celery bench fetch-ab --rounds 6 --jobs 40`` starts two emulated
workers with ``compass_atomic_fetch`` on, then two with it off (the order swaps every
round, so drift in the machine's speed hits both alike), and times on each pair a 3-task
no-op ``Dag`` and Celery's 3-task ``chain`` of plain tasks, as the regression gate does.
It prints each round's p50/p99 and, per side, the median of the rounds' p50 and p99 with
their spread (max - min over rounds): the atomic fetch costs nothing when its medians
lie within the other side's spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ..local import RedisServer, WorkerProcess, wait_until

SIDES = ("on", "off")


def _workers(url: str, prefix: str, atomic: bool, tag: str) -> list[WorkerProcess]:
    env = {"COMPASS_BROKER_URL": url, "COMPASS_KEY_PREFIX": prefix,
           "COMPASS_ATOMIC_FETCH": "1" if atomic else "0"}
    return [WorkerProcess("compass_celery.emulated_app", f"ab{i}{tag}@bench",
                          ["--compass-emulate-gpu-mb", "1600", "--compass-preload",
                           "detector,translator,classifier"], env=env).start()
            for i in range(2)]


def _jobs(app: Any) -> dict[str, Callable[[], Any]]:
    """The two timed jobs: a 3-task no-op Dag and a 3-task chain of plain tasks."""
    from celery import chain

    from ..jobs.dag import Dag

    plain, infer, step = (app.tasks[f"emulated.{t}"] for t in ("plain", "infer", "step"))
    dag = Dag(app, "noop3")
    a = dag.node("a", infer.s("detector", 0, None), model="detector", exec_ms=0)
    b = dag.node("b", step.s("translator", 0), after=[a], model="translator", exec_ms=0)
    dag.node("c", step.s("classifier", 0), after=[b], model="classifier", exec_ms=0)
    return {"chain": lambda: chain(plain.s(1), plain.s(), plain.s()).apply_async()
            .get(timeout=30),
            "dag": lambda: dag.apply_async().get(timeout=30)}


def side_run(url: str, atomic: bool, tag: str, jobs: int) -> dict[str, list[float]]:
    """One side of one round: ms per job of each kind, the kinds alternated."""
    from ..emulated import make_app

    prefix = f"ab{tag}"
    ws = _workers(url, prefix, atomic, tag)
    try:
        app = make_app(url, compass_key_prefix=prefix)
        try:
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3).workers) == 2,
                       120, "two workers")
        except TimeoutError as exc:  # say why: the workers' own words
            raise TimeoutError(f"{exc}\n" + "\n".join(w.log()[-3000:] for w in ws)) from None
        timed = _jobs(app)
        try:
            for fn in timed.values():  # warm: models, connections, the first plans
                for _ in range(3):
                    fn()
        except Exception as exc:  # say why: the workers' own words
            raise RuntimeError(f"{exc!r}\n" + "\n".join(w.log()[-4000:] for w in ws)) \
                from None
        out: dict[str, list[float]] = {kind: [] for kind in timed}
        for _ in range(jobs):
            for kind, fn in timed.items():
                t = time.perf_counter()
                fn()
                out[kind].append((time.perf_counter() - t) * 1e3)
        return out
    finally:
        for w in ws:
            w.stop()


def percentile(ms: list[float], q: float) -> float:
    """The ``q`` quantile of ``ms`` (nearest rank below, as the regression gate takes)."""
    ordered = sorted(ms)
    return ordered[int(q * (len(ordered) - 1))]


def run(rounds: int, jobs: int, echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Alternate the sides for ``rounds`` rounds; per side and metric, each round's value."""
    table: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
    with RedisServer() as server:
        for r in range(rounds):
            for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                got = side_run(server.url, side == "on", f"{r}{side}", jobs)
                row = {f"{kind} {name} ms": f(ms)
                       for kind, ms in got.items()
                       for name, f in (("p50", statistics.median),
                                       ("p99", lambda m: percentile(m, 0.99)))}
                for metric, value in row.items():
                    table[side].setdefault(metric, []).append(value)
                echo(f"round {r + 1}/{rounds} atomic fetch {side:3s}: " + "  ".join(
                    f"{m.removesuffix(' ms')} {v:6.2f}" for m, v in row.items()))
    echo(f"{'metric':16s} {'on':>8s} {'spread':>8s} {'off':>8s} {'spread':>8s}")
    for metric in table["on"]:
        on, off = table["on"][metric], table["off"][metric]
        echo(f"{metric:16s} {statistics.median(on):8.2f} {max(on) - min(on):8.2f} "
             f"{statistics.median(off):8.2f} {max(off) - min(off):8.2f}")
    return table
