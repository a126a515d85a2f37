"""A long soak: does compass's footprint stay flat under a steady stream of jobs?

Every job record, output and once-guard compass writes to Redis carries an expiry
(``compass_job_ttl_s``), so under a steady arrival rate the number of keys and Redis's
``used_memory`` should rise for one expiry and then stay level: what arrives per second
equals what expires per second. The longest expiry is the fill time: the job TTL, or
a submission's once-guards (``compass_submit_retry_s`` + 60 s, ``jobs/submit.py``),
whichever is longer. A key without an expiry, or one re-created without it
(say by a Redis restart replaying the AOF), shows as a level that keeps rising; a leak
in a worker shows as a resident set (RSS) that keeps growing.

The soak starts a private ``redis-server`` (AOF on, so a restart keeps the jobs) and
real emulated-GPU workers, submits small Dag jobs at ``--rate`` per second (chains and
diamonds, some with a 64 KB input, some failing, some with a deadline they are refused
at submission or shed for) for ``--minutes``, optionally restarts Redis in the middle,
then stops submitting and keeps sampling for one more fill time (the drain). Every
``--sample-s`` it records ``DBSIZE``, the keys of jobs, ``used_memory``, each worker's
RSS (``VmRSS`` of its process tree, from /proc) and the job counts.

The verdict (:func:`verdict`) compares the windows after the fill time: the run's
samples from then to the end of the stream are split at the midpoint into an early
window A and a late window B; a level is flat when ``max(B) <= max(A) * (1 + rel) +
abs``. The least-squares growth per minute over A and B is reported beside it, since a
leak slower than the tolerance passes the max rule over a short run but shows in the
slope (and in a longer run).

``compass-celery bench soak --minutes 10 --rate 2 --restart-redis-at-s 300``
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..emulated import lazy_app
from .hostload import stat_fields

MODEL = "captioner"
GPU = ["--compass-emulate-gpu-mb", "1600", "--compass-preload", MODEL]
#: A node's declared (and slept) run time, ms.
NODE_MS = 40.0
#: The larger input every 10th job carries, so records of different weights expire.
BIG_INPUT = "x" * 65536
#: The worker app's job TTL comes from here (the emulated app reads no TTL from the env).
TTL_ENV = "COMPASS_SOAK_JOB_TTL_S"
MB = 2**20
#: A once-guard outlives its submission's retries by this much (jobs/submit.py).
ONCE_GUARD_EXTRA_S = 60.0

#: Tolerances of the flatness rule, per level: (relative, absolute in the level's unit).
KEYS_TOL = (0.10, 20.0)
MEMORY_TOL = (0.10, 0.5)  # MB
RSS_TOL = (0.05, 2.0)  # MB
#: The module ``celery -A`` loads for the workers (this one, also when run as __main__).
WORKER_APP = "compass_celery.bench.soak"


def _worker_app() -> Any:
    """The emulated app with a short job TTL: ``celery -A compass_celery.bench.soak``."""
    from ..emulated import make_app

    return make_app(compass_job_ttl_s=float(os.environ.get(TTL_ENV, "3600")))


__getattr__ = lazy_app(__name__, _worker_app)


# ---------------------------------------------------------------- sampling (pure parts)

def parse_vmrss_kb(status: str) -> int | None:
    """``VmRSS`` in kB from the text of /proc/<pid>/status (None for a kernel thread or a
    zombie, which have no such line)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def parse_ppid(stat: str) -> int | None:
    """The parent pid from the text of /proc/<pid>/stat (:func:`stat_fields`)."""
    rest = stat_fields(stat)
    return int(rest[1]) if len(rest) >= 2 and rest[1].isdigit() else None


def descendants(root: int, parents: Mapping[int, int]) -> set[int]:
    """``root`` and every process below it, given pid -> parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo.extend(children.get(pid, ()))
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:  # the process ended between the listing and the read
        return None


def tree_rss_kb(root: int, proc: str = "/proc") -> int | None:
    """Summed VmRSS (kB) of ``root``'s process tree; None once ``root`` is gone. psutil is
    not a dependency, so /proc is read directly (Linux only)."""
    parents = {}
    for entry in os.listdir(proc):
        if entry.isdigit():
            stat = _read(f"{proc}/{entry}/stat")
            ppid = parse_ppid(stat) if stat else None
            if ppid is not None:
                parents[int(entry)] = ppid
    if root not in parents:
        return None
    total = 0
    for pid in descendants(root, parents):
        status = _read(f"{proc}/{pid}/status")
        total += (parse_vmrss_kb(status) if status else None) or 0
    return total


# ---------------------------------------------------------------------- the verdict

@dataclass(frozen=True)
class Level:
    """One level's flatness: the maxima of the two windows and the growth per minute."""

    name: str
    unit: str
    max_a: float | None
    max_b: float | None
    allowed: float | None
    slope_per_min: float | None
    flat: bool | None  # None: too few samples to tell

    def line(self) -> str:
        """One line for the printed verdict."""
        if self.flat is None:
            return f"{self.name}: inconclusive (fewer than 3 samples in a window after the fill)"
        assert self.max_a is not None and self.max_b is not None and self.allowed is not None
        word = "FLAT" if self.flat else "GROWING"
        slope = "" if self.slope_per_min is None else \
            f", growth {self.slope_per_min:+.3f} {self.unit}/min"
        return (f"{self.name}: {word}: max after the fill {self.max_a:.2f} {self.unit}, "
                f"max over the last half {self.max_b:.2f} (allowed "
                f"{self.allowed:.2f}){slope}")


def slope_per_min(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t in s, value), per minute; None for fewer than 2 times."""
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    num = sum((t - mt) * (v - mv) for t, v in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * num / den


def windows(points: Iterable[tuple[float, float]], start_s: float, end_s: float
            ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The points in [start_s, end_s], split at the midpoint: (A, B). Before ``start_s``
    (the fill time) the level is still rising, so it is in neither."""
    mid = (start_s + end_s) / 2
    kept = [(t, v) for t, v in points if start_s <= t <= end_s]
    return [p for p in kept if p[0] < mid], [p for p in kept if p[0] >= mid]


def level(name: str, unit: str, points: Iterable[tuple[float, float]], start_s: float,
          end_s: float, tol: tuple[float, float]) -> Level:
    """Whether ``points`` are flat after ``start_s``: max(B) <= max(A) * (1 + rel) + abs."""
    a, b = windows(points, start_s, end_s)
    if len(a) < 3 or len(b) < 3:
        return Level(name, unit, None, None, None, None, None)
    max_a, max_b = max(v for _, v in a), max(v for _, v in b)
    allowed = max_a * (1 + tol[0]) + tol[1]
    return Level(name, unit, max_a, max_b, allowed, slope_per_min(a + b), max_b <= allowed)


def fill_s(job_ttl_s: float, submit_retry_s: float) -> float:
    """How long the key count rises before expiries balance arrivals: the longest expiry
    of what a job leaves, its records or its submission's once-guards."""
    return max(job_ttl_s, submit_retry_s + ONCE_GUARD_EXTRA_S)


def verdict(samples: Sequence[Mapping[str, Any]], ttl_s: float) -> dict[str, Level]:
    """Keys, ``used_memory`` and each worker's RSS judged over the run's samples (the
    drain's are left out: there the level falls by design). Samples taken while Redis
    was down hold None and are skipped."""
    run = [s for s in samples if s.get("phase", "run") == "run"]
    if not run:
        return {}
    end = max(s["t"] for s in run)

    def pts(get: Any) -> list[tuple[float, float]]:
        return [(s["t"], float(v)) for s in run if (v := get(s)) is not None]

    out = {"keys": level("keys", "keys", pts(lambda s: s.get("keys")), ttl_s, end, KEYS_TOL),
           "used_memory": level("used_memory", "MB", pts(lambda s: _mb(s.get("used_memory"),
                                                                         MB)), ttl_s, end,
                                MEMORY_TOL)}
    workers = sorted({w for s in run for w in (s.get("rss_kb") or {})})
    for w in workers:
        out[f"rss {w}"] = level(f"RSS {w}", "MB", pts(lambda s, w=w: _mb(
            (s.get("rss_kb") or {}).get(w), 1024)), ttl_s, end, RSS_TOL)
    return out


def _mb(value: float | None, per_mb: float) -> float | None:
    return None if value is None else value / per_mb


def backlog_note(samples: Sequence[Mapping[str, Any]], ttl_s: float) -> str | None:
    """A warning when the jobs in flight kept rising after ``ttl_s`` (the fill time): the
    workers do not keep up with ``--rate``, and a rising key count is then a backlog, not
    a leak."""
    run = [s for s in samples if s.get("phase", "run") == "run"]
    if not run:
        return None
    lv = level("in flight", "jobs", [(s["t"], float(s["in_flight"])) for s in run], ttl_s,
               max(s["t"] for s in run), (0.5, 10.0))
    if lv.flat is False:
        return (f"jobs in flight rose from at most {lv.max_a:.0f} to {lv.max_b:.0f}: the "
                "workers do not keep up with --rate; lower it, or add --workers")
    return None


# -------------------------------------------------------------------------- the run

@dataclass
class Counts:
    """Job outcomes so far; written by the submitting and waiting threads under ``lock``."""

    submitted: int = 0
    ok: int = 0
    failed: int = 0  # jobs built to fail that did
    failed_unexpected: int = 0
    rejected: int = 0  # refused at submission (deadline_ms)
    shed: int = 0  # admitted, then dropped for their deadline (DeadlineMissed)
    lost: int = 0  # record gone (e.g. expired before it was read)
    timed_out: int = 0
    submit_errors: int = 0
    wait_errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, what: str) -> None:
        """Count one more job of outcome ``what`` (a field name)."""
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    def snapshot(self) -> dict[str, int]:
        """The counts, plus how many jobs ended and how many are still in flight."""
        with self.lock:
            d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}
        ended = sum(d[k] for k in ("ok", "failed", "failed_unexpected", "shed", "lost",
                                   "timed_out", "wait_errors"))
        admitted = d["submitted"] - d["rejected"] - d["submit_errors"]
        return {**d, "ended": ended, "in_flight": admitted - ended}


def job_kind(i: int) -> str:
    """The i-th job's kind: a fixed mix, so two runs submit the same stream."""
    if i % 25 == 7:
        return "failing"
    if i % 20 == 3:
        return "refused"  # a deadline shorter than its run time: Rejected
    if i % 20 == 13:
        return "tight"  # a deadline with little slack: admitted, sometimes shed
    if i % 10 == 0:
        return "big"
    return "diamond" if i % 4 == 1 else "chain"


def build(app: Any, i: int, kind: str) -> tuple[Any, float | None]:
    """The i-th job as a Dag, and its ``deadline_ms`` (None: no deadline)."""
    from ..jobs.dag import Dag

    infer, step = app.tasks["emulated.infer"], app.tasks["emulated.step"]
    dag = Dag(app, f"soak-{kind}")
    data = BIG_INPUT if kind == "big" else f"job-{i}"
    a = dag.node("a", infer.s(MODEL, NODE_MS, data), model=MODEL, exec_ms=NODE_MS)
    if kind == "failing":  # a dict doubled: TypeError in the worker
        dag.node("b", app.tasks["emulated.plain"].s(), after=[a])
        return dag, None
    b = dag.node("b", step.s(MODEL, NODE_MS), after=[a], model=MODEL, exec_ms=NODE_MS)
    if kind == "diamond":
        c = dag.node("c", step.s(MODEL, NODE_MS), after=[a], model=MODEL, exec_ms=NODE_MS)
        dag.node("d", step.s(MODEL, NODE_MS), after=[b, c], model=MODEL, exec_ms=NODE_MS)
    deadline = {"refused": NODE_MS / 2, "tight": 4 * NODE_MS}.get(kind)
    return dag, deadline


def _wait_jobs(todo: queue.Queue[Any], counts: Counts, wait_s: float) -> None:
    """End each submitted job: its outcome into ``counts``. A Redis error (a restart)
    is retried for a while before it counts."""
    from ..errors import DeadlineMissed, JobFailed, JobTimeout
    from ..errors import JobError as _JobError

    while (item := todo.get()) is not None:
        kind, handle = item
        for attempt in range(20):
            try:
                handle.get(timeout=wait_s)
                counts.add("ok")
            except DeadlineMissed:
                counts.add("shed")
            except JobFailed:
                counts.add("failed" if kind == "failing" else "failed_unexpected")
            except JobTimeout:
                counts.add("timed_out")
            except _JobError:
                counts.add("lost")
            except Exception:  # Redis restarting: ConnectionError, BusyLoadingError, ...
                if attempt < 19:
                    time.sleep(0.5)
                    continue
                counts.add("wait_errors")
            break


def _sample(client: Any, t: float, phase: str, workers: Sequence[Any], counts: Counts
            ) -> dict[str, Any]:
    """One sample; the Redis fields are None when it does not answer (restarting)."""
    s: dict[str, Any] = {"t": round(t, 2), "phase": phase, "keys": None, "job_keys": None,
                         "used_memory": None}
    try:
        s["keys"] = int(client.dbsize())
        s["job_keys"] = sum(1 for _ in client.scan_iter(match="*:job:*", count=1000))
        s["used_memory"] = int(client.info("memory")["used_memory"])
    except Exception:  # a sample while Redis restarts: recorded as None
        pass
    s["rss_kb"] = {w.name: kb for w in workers
                   if w.proc is not None and (kb := tree_rss_kb(w.proc.pid)) is not None}
    s.update(counts.snapshot())
    return s


@dataclass
class SoakOptions:
    """What one soak runs: duration, arrival rate, cluster and sampling."""

    minutes: float = 10.0
    rate: float = 2.0
    workers: int = 2
    job_ttl_s: float = 60.0
    restart_redis_at_s: float | None = None
    sample_s: float = 5.0
    drain_s: float | None = None  # default: the fill time plus 10 s
    wait_s: float = 120.0


def _cluster(stack: contextlib.ExitStack, opts: SoakOptions) -> tuple[Any, list[Any], Any,
                                                                      Any, str]:
    """A private Redis (with an AOF: a restart keeps the jobs), the workers and the
    producer app, all stopped with ``stack``; -> (server, workers, app, client, log dir)."""
    import redis

    from ..emulated import make_app
    from ..local import RedisServer, WorkerProcess, wait_until

    server = stack.enter_context(RedisServer(args=["--appendonly", "yes"]))
    env = {"COMPASS_BROKER_URL": server.url, "COMPASS_REDIS_URL": server.url,
           "COMPASS_HEARTBEAT_TIMEOUT_S": "3.0", TTL_ENV: str(opts.job_ttl_s)}
    logs = tempfile.mkdtemp(prefix="compass-soak-")
    procs = [WorkerProcess(WORKER_APP, f"s{i}@soak", GPU, env=env,
                           log_path=os.path.join(logs, f"s{i}.log")).start()
             for i in range(opts.workers)]
    for p in procs:
        stack.callback(p.stop)
    app = make_app(server.url, state_url=server.url, compass_snapshot_ttl_s=0.0,
                   compass_job_ttl_s=opts.job_ttl_s, compass_job_timeout_s=60)
    stack.callback(app.compass.close)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers)
               == opts.workers, 90, f"{opts.workers} workers (logs in {logs})")
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    stack.callback(client.close)
    return server, procs, app, client, logs


def _submit_stream(app: Any, opts: SoakOptions, counts: Counts, todo: queue.Queue[Any],
                   t0: float, restart: Callable[[], None]) -> threading.Thread | None:
    """Submit the job stream at ``opts.rate`` for ``opts.minutes``, handing each job to
    the waiters; restart Redis (on a thread) when due; -> the restarting thread."""
    from ..errors import Rejected

    restarter = None
    i, next_at = 0, t0
    while (now := time.monotonic()) - t0 < opts.minutes * 60:
        if (restarter is None and opts.restart_redis_at_s is not None
                and now - t0 >= opts.restart_redis_at_s):
            restarter = threading.Thread(target=restart, daemon=True)
            restarter.start()
        if now < next_at:
            time.sleep(min(next_at - now, 0.2))
            continue
        next_at = max(next_at + 1 / opts.rate, now - 1.0)  # no burst after a stall
        kind = job_kind(i)
        dag, deadline = build(app, i, kind)
        counts.add("submitted")
        i += 1
        try:
            todo.put((kind, dag.apply_async(deadline_ms=deadline)))
        except Rejected:
            counts.add("rejected")
        except Exception as exc:  # Redis restarting for longer than submit_retry_s
            counts.add("submit_errors")
            if counts.submit_errors <= 3:
                print(f"soak: submission failed: {exc!r}"[:300], file=sys.stderr)
    return restarter


def run(opts: SoakOptions) -> dict[str, Any]:
    """One soak; the samples, the counts and the verdict as JSON-ready data."""
    counts = Counts()
    samples: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        server, procs, app, client, logs = _cluster(stack, opts)
        time.sleep(1.0)
        base = _sample(client, 0.0, "base", procs, counts)
        todo: queue.Queue[Any] = queue.Queue()
        waiters = [threading.Thread(target=_wait_jobs, args=(todo, counts, opts.wait_s),
                                    daemon=True) for _ in range(4)]
        for w in waiters:
            w.start()
        stop = threading.Event()
        t0 = time.monotonic()
        run_s = opts.minutes * 60
        fill = fill_s(opts.job_ttl_s, app.compass.settings.submit_retry_s)

        def sampler() -> None:
            k = 1
            while not stop.is_set():
                now = time.monotonic() - t0
                samples.append(_sample(client, now, "run" if now <= run_s else "drain",
                                       procs, counts))
                stop.wait(max(0.0, t0 + k * opts.sample_s - time.monotonic()))
                k += 1

        def restart() -> None:
            events.append({"t": round(time.monotonic() - t0, 2), "event": "redis restart"})
            server.restart()  # SIGTERM: the AOF is flushed, and the jobs survive
            events.append({"t": round(time.monotonic() - t0, 2), "event": "redis up"})

        sampling = threading.Thread(target=sampler, daemon=True)
        sampling.start()
        restarter = _submit_stream(app, opts, counts, todo, t0, restart)
        for _ in waiters:
            todo.put(None)
        # the sampler goes on: the level falls back as records expire
        time.sleep(fill + 10 if opts.drain_s is None else opts.drain_s)
        stop.set()
        sampling.join()
        for w in waiters:
            w.join(opts.wait_s)
        if restarter is not None:
            restarter.join()
        dead = [p.name for p in procs if not p.alive()]
    levels = verdict(samples, fill)
    return {"options": asdict(opts), "base": base, "events": events, "samples": samples,
            "counts": counts.snapshot(), "dead_workers": dead,
            "verdict": {k: asdict(v) for k, v in levels.items()},
            "backlog": backlog_note(samples, fill), "worker_logs": logs, "fill_s": fill}


# ------------------------------------------------------------------------ reporting

def table(samples: Sequence[Mapping[str, Any]], rows: int = 30) -> str:
    """The samples as a Markdown table, thinned to about ``rows`` rows (the last kept)."""
    step = max(1, -(-len(samples) // rows))
    picked = list(samples[::step])
    if samples and picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    out = ["| t (s) | phase | keys | job keys | used_memory (MB) | worker RSS (MB) | "
           "submitted | ended | in flight |", "|---|---|---|---|---|---|---|---|---|"]
    for s in picked:
        rss = " / ".join(f"{kb / 1024:.1f}" for _, kb in sorted((s.get("rss_kb") or {})
                                                                 .items())) or "-"
        mem = "-" if s.get("used_memory") is None else f"{s['used_memory'] / MB:.2f}"
        out.append(f"| {s['t']:.0f} | {s.get('phase', 'run')} | "
                   f"{'-' if s.get('keys') is None else s['keys']} | "
                   f"{'-' if s.get('job_keys') is None else s['job_keys']} | {mem} | {rss} | "
                   f"{s.get('submitted', 0)} | {s.get('ended', 0)} | {s.get('in_flight', 0)} |")
    return "\n".join(out)


def summary(result: Mapping[str, Any]) -> str:
    """The table, the counts, the events and the verdict, as printed."""
    o, c, base = result["options"], result["counts"], result["base"]
    lines = [table(result["samples"]), "",
             f"jobs: {c['submitted']} submitted, {c['ok']} ok, {c['failed']} failed as built "
             f"(+{c['failed_unexpected']} unexpectedly), {c['rejected']} rejected, "
             f"{c['shed']} shed, {c['lost']} lost, {c['timed_out']} timed out, "
             f"{c['submit_errors']} submit errors, {c['wait_errors']} wait errors",
             f"base: {base['keys']} keys, {(base['used_memory'] or 0) / MB:.2f} MB"]
    lines += [f"event at {e['t']:.0f} s: {e['event']}" for e in result["events"]]
    drain = [s for s in result["samples"] if s["phase"] == "drain" and s["keys"] is not None]
    if drain:
        lines.append(f"after the drain ({drain[-1]['t'] - o['minutes'] * 60:.0f} s without "
                     f"jobs): {drain[-1]['keys']} keys ({drain[-1]['job_keys']} of jobs), "
                     f"{drain[-1]['used_memory'] / MB:.2f} MB")
    lines.append(f"verdict (windows from {result['fill_s']:.0f} s, the longest expiry (job TTL "
                 f"{o['job_ttl_s']:.0f} s, once-guards), to the end of the stream, split at "
                 "the middle; flat: max(late) <= max(early) * (1+rel) + abs):")
    for v in result["verdict"].values():
        lines.append("  " + Level(**v).line())
    if result.get("backlog"):
        lines.append("  note: " + result["backlog"])
    if result["dead_workers"]:
        lines.append(f"  workers that died: {result['dead_workers']} "
                     f"(logs in {result['worker_logs']})")
    return "\n".join(lines)


def flat(result: Mapping[str, Any]) -> bool:
    """Whether every level was judged flat (an inconclusive one is not)."""
    return bool(result["verdict"]) and all(v["flat"] for v in result["verdict"].values())
