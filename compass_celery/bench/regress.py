"""The regression gate: today's code against a base commit's, alternated, on one machine.

Each round runs a probe once for the base (a ``git worktree`` of it) and once for the
working tree, in turn, in fresh interpreters, so drift in the machine's speed hits both
alike. The probe simulates every shipped workload (``dags/*.json``) under compass and
a 1,000-worker cluster, and times the hot path: one routing decision among 64 workers
and, with ``--chains``, a 3-task no-op Dag against Celery's chain on two workers.

A timing is *slower* when today's median exceeds the base's by more than the spread
the rounds themselves show (the larger of the two sides' max - min) and by more than
``--tolerance`` of the base. A simulated result that differs is *changed*: not a
slowdown, but a difference in what the simulator computes, which a commit should name.

The probe also times the host itself (``host ...``: a bare Python loop, a Redis ping, a
Celery enqueue by an app without compass), which no commit changes: the session hosts
differ by over 2x, so an absolute figure says little without them. They are never a
slowdown; the report prints them, and the routing decision as a multiple of that enqueue.

The gate lives outside pytest on purpose: timings are flaky on a shared test machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Runs in a fresh interpreter with the side's tree first on ``sys.path``; prints one
#: JSON object: metric -> value. It uses only interfaces the base also has.
PROBE = r'''
import json, statistics, sys, time
root, workloads, chains = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
sys.path.insert(0, root)
import compass_celery
assert compass_celery.__file__.startswith(root), (compass_celery.__file__, root)
from compass_celery.sim import simulate
from compass_celery.workload import load_workload
out = {}
for path, jobs, workers, rate in workloads:
    name = path.rsplit("/", 1)[-1].removesuffix(".json") + (f"@{workers}w" if workers else "")
    kw = {"workers": workers} if workers else {}
    if rate:
        kw["rate"] = rate
    t = time.perf_counter()
    r = simulate(load_workload(path), ["compass"], jobs=jobs, **kw)["policies"]["compass"]
    out[f"sim {name} wall s"] = time.perf_counter() - t
    out[f"sim {name} plan p50 ms"] = r["plan_ms"]["p50"]
    out[f"result {name} mean ms"] = round(r["latency_ms"]["mean"], 6)
    out[f"result {name} completed"] = r["completed"]
from compass_celery.local import RedisServer
from compass_celery.bench import overhead
with RedisServer() as server:
    from compass_celery.emulated import make_app
    app = make_app(server.url, compass_key_prefix="regress", compass_snapshot_ttl_s=60.0,
                   compass_heartbeat_timeout_s=3600.0)
    overhead._fake_workers(app, 64)
    router, task = app.compass.router, app.tasks["emulated.caption"]
    router("emulated.caption", (), {}, {}, task)
    us = overhead._time(lambda: router("emulated.caption", (), {}, {}, task), 2000, 1e6)
    out["route 64 workers us"] = statistics.median(us)
    # the host's own speed, which no commit changes: what the timings above are read against
    from celery import Celery
    def noop(x):
        return x
    plain = Celery("host", broker=server.url).task(name="host.noop")(noop)
    client = app.compass.store.client
    out["host redis ping us"] = statistics.median(overhead._time(client.ping, 500, 1e6))
    for _ in range(50):  # a Celery app without compass: its enqueue, as users know it
        plain.apply_async((1,))
    out["host celery enqueue us"] = statistics.median(
        overhead._time(lambda: plain.apply_async((1,)), 500, 1e6))
    out["route 64 workers / celery enqueue x"] = (out["route 64 workers us"]
                                                  / out["host celery enqueue us"])
    t = time.perf_counter()
    total = 0
    for k in range(2_000_000):
        total += k
    out["host python loop s"] = time.perf_counter() - t
    if chains:
        from celery import chain
        from compass_celery.jobs.dag import Dag
        from compass_celery.local import WorkerProcess, wait_until
        env = {"COMPASS_BROKER_URL": server.url, "COMPASS_KEY_PREFIX": "ovh"}
        ws = [WorkerProcess("compass_celery.emulated_app", f"reg{i}@bench",
                            ["--compass-emulate-gpu-mb", "1600", "--compass-preload",
                             "detector,translator,classifier"], env=env).start()
              for i in range(2)]
        try:
            app = make_app(server.url, compass_key_prefix="ovh")
            wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3).workers) == 2,
                       60, "two workers")
            plain, infer, step = (app.tasks[f"emulated.{t}"] for t in ("plain", "infer", "step"))
            dag = Dag(app, "noop3")
            a = dag.node("a", infer.s("detector", 0, None), model="detector", exec_ms=0)
            b = dag.node("b", step.s("translator", 0), after=[a], model="translator",
                         exec_ms=0)
            dag.node("c", step.s("classifier", 0), after=[b], model="classifier", exec_ms=0)
            runs = overhead.Alternated([])
            for _ in range(100):
                runs.time("chain", lambda: chain(plain.s(1), plain.s(), plain.s())
                          .apply_async().get(timeout=10))
                runs.time("dag", lambda: dag.apply_async().get(timeout=10))
            for kind in ("chain", "dag"):
                ms = sorted(runs.ms[kind])
                out[f"{kind} p50 ms"] = statistics.median(ms)
                out[f"{kind} p99 ms"] = ms[int(0.99 * (len(ms) - 1))]
            out["dag/chain p50 x"] = out["dag p50 ms"] / out["chain p50 ms"]
        finally:
            for w in ws:
                w.stop()
print("REGRESS " + json.dumps(out))
'''

#: (workload, jobs, workers, rate) of the run at scale: 1,000 workers at 1,500 jobs/s.
AT_SCALE = ("dags/edge-vision.json", 10_000, 1000, 1500.0)


#: The prefix of the metrics that time the host, not the code (never a slowdown).
HOST = "host "


@dataclass(frozen=True)
class Verdict:
    """One metric, base against today: medians, the rounds' spread, and what it means."""

    metric: str
    base: float
    today: float
    spread: float
    word: str  # "slower", "faster", "same", "changed" (a result), "host" or "missing"


def judge(base: Mapping[str, Sequence[float]], today: Mapping[str, Sequence[float]],
          tolerance: float = 0.05) -> list[Verdict]:
    """Each metric's verdict. Timings (everything but ``result ...``) are slower or
    faster only beyond both the rounds' spread and ``tolerance`` of the base's median;
    a result is the same only when every round of both sides agrees."""
    out = []
    for metric in sorted(set(base) | set(today)):
        b, t = base.get(metric), today.get(metric)
        if not b or not t:
            out.append(Verdict(metric, _median(b), _median(t), 0.0, "missing"))
            continue
        mb, mt = statistics.median(b), statistics.median(t)
        spread = max(max(b) - min(b), max(t) - min(t))
        if metric.startswith("result "):
            word = "same" if set(b) == set(t) and len(set(b)) == 1 else "changed"
        elif metric.startswith(HOST):
            word = "host"  # the machine's speed, not the code's
        else:
            margin = max(spread, tolerance * abs(mb))
            word = "slower" if mt - mb > margin else "faster" if mb - mt > margin else "same"
        out.append(Verdict(metric, mb, mt, spread, word))
    return out


def _median(values: Sequence[float] | None) -> float:
    return statistics.median(values) if values else float("nan")


def probe(root: Path, workloads: list[tuple[str, int | None, int, float]], chains: bool,
          python: str = sys.executable) -> dict[str, float]:
    """Run the probe once on the tree at ``root``; its metrics."""
    done = subprocess.run([python, "-c", PROBE, str(root), json.dumps(workloads),
                           "1" if chains else "0"], cwd=root, capture_output=True,
                          text=True, timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("REGRESS "):
            return json.loads(line[len("REGRESS "):])
    raise RuntimeError(f"the probe failed on {root}:\n{done.stdout[-2000:]}\n"
                       f"{done.stderr[-4000:]}")


def shipped(root: Path) -> list[tuple[str, int | None, int, float]]:
    """The workloads the probe runs: every shipped one as its file gives it, and one at
    1,000 workers."""
    found = sorted(str(p.relative_to(root)) for p in (root / "dags").glob("*.json"))
    return [(path, None, 0, 0.0) for path in found] + [AT_SCALE]


def run(base_rev: str, rounds: int, chains: bool, tolerance: float,
        echo: Callable[[str], Any] = print) -> list[Verdict]:
    """Alternate the probe on ``base_rev`` (a worktree) and the working tree for
    ``rounds`` rounds; each metric's verdict."""
    here = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                               text=True, check=True).stdout.strip())
    samples: dict[str, dict[str, list[float]]] = {"base": {}, "today": {}}
    with tempfile.TemporaryDirectory(prefix="compass-regress-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), base_rev],
                       cwd=here, check=True)
        # the workloads both trees ship: one added since the base has nothing to compare
        workloads = [w for w in shipped(here) if (base / w[0]).exists()]
        try:
            for i in range(rounds):
                for side, root in (("base", base), ("today", here)):
                    echo(f"round {i + 1}/{rounds}: {side}")
                    for metric, value in probe(root, workloads, chains).items():
                        samples[side].setdefault(metric, []).append(float(value))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=here,
                           check=False)
    return judge(samples["base"], samples["today"], tolerance)


def report(verdicts: Sequence[Verdict], echo: Callable[[str], Any] = print) -> bool:
    """Print the table and the overall verdict; True when nothing is slower."""
    echo(f"{'metric':44s} {'base':>12s} {'today':>12s} {'spread':>10s}  verdict")
    for v in verdicts:
        echo(f"{v.metric:44s} {v.base:12.4g} {v.today:12.4g} {v.spread:10.3g}  {v.word}")
    host = {v.metric: v for v in verdicts if v.word == "host"}
    if host:
        echo("host (base / today medians): " + ", ".join(
            f"{m.removeprefix(HOST)} {v.base:.4g} / {v.today:.4g}" for m, v in host.items()))
    slower = [v.metric for v in verdicts if v.word == "slower"]
    changed = [v.metric for v in verdicts if v.word == "changed"]
    echo(f"verdict: {'SLOWER: ' + ', '.join(slower) if slower else 'no slowdown'}"
         + (f"; results changed: {', '.join(changed)}" if changed else ""))
    return not slower
