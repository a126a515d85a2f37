"""Where urgent successors waited, from the trace lines workers write with
``COMPASS_TRACE_DIR`` set (:mod:`compass_celery.tracing`): ``compass-celery bench
trace-waits DIR --time-scale S``.

For each successor sent at level 9: its wait (from its send to its start, or to its drop
past its latest start), the age of the snapshot its placement read, and what that
snapshot said was left ahead of it on the chosen worker; then each span that ran on that
worker while it waited, by what it was: urgent or batch, a first step or a later step,
running at the send or started after it, and for a batch span running at the send,
whether it started before the snapshot was taken (the placement saw it) or after (a
stale snapshot). All in workload ms (real ms divided by the time scale).
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter, defaultdict
from typing import Any

#: The first steps of the navigator-mixed interactive Dags (question_answer, img_to_sound).
FIRST_STEPS = ("generate", "vit")


def load(folder: str) -> list[dict[str, Any]]:
    """Every trace line under ``folder``."""
    out = []
    for path in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def _q(xs: list[float], f: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else float("nan")


def report(lines: list[dict[str, Any]], scale: float, level: int = 9) -> str:
    """The summary :mod:`this module <compass_celery.bench.trace_waits>` prints."""
    send = {e["id"]: e for e in lines if e["kind"] == "send"}
    end = {e["id"]: e for e in lines if e["kind"] in ("start", "expired")}
    rows, spans, counts = [], defaultdict(float), Counter()
    for tid, s in send.items():
        e = end.get(tid)
        if s.get("level") != level or e is None:
            continue
        t0, waited = e["sent"], 1000 * (e["t"] - e["sent"])
        age = 1000 * (t0 - s["snap_taken"]) if s.get("snap_taken") else 0.0
        rows.append(
            {
                "wait": waited / scale,
                "age": age / scale,
                "expired": e["kind"] == "expired",
                "seen": ((s.get("seen") or {}).get("left_ms") or 0.0),
            }
        )
        for sp in e["ran_between"]:
            a = max(sp["start_ms"], 0.0)
            b = min(sp["end_ms"] if sp["end_ms"] is not None else waited, waited)
            urgent = sp["level"] == level
            what = (
                ("first step" if sp["node"] in FIRST_STEPS else "later step") if urgent else "step"
            )
            if sp["start_ms"] > 0:
                when = "started after the send"
            elif urgent or sp["start_ms"] <= -age:
                when = "running at the send"
            else:
                when = "running at the send, started after the snapshot"
            key = f"{'urgent' if urgent else 'batch'} {what}, {when}"
            spans[key] += max(0.0, b - a) / scale
            counts[key] += 1
    out = [
        f"level-{level} successors: {len(rows)}, dropped past their latest start: "
        f"{sum(r['expired'] for r in rows)}; sheds at release: "
        f"{sum(1 for e in lines if e['kind'] == 'shed')}"
    ]
    for key, name in (("wait", "wait"), ("age", "snapshot age"), ("seen", "seen ahead")):
        xs = [r[key] for r in rows]
        out.append(
            f"  {name:13s} p50 {_q(xs, 0.5):6.1f}  p90 {_q(xs, 0.9):6.1f}  "
            f"max {max(xs, default=0.0):6.1f} ms"
        )
    out.append("what ran on the chosen worker while they waited (ms of their waits):")
    for key, ms in sorted(spans.items(), key=lambda kv: -kv[1]):
        out.append(f"  {key:60s} n={counts[key]:3d}  {ms:7.0f} ms  ({ms / counts[key]:4.0f} each)")
    return "\n".join(out)



def hop_times(lines: list[dict[str, Any]], scale: float) -> dict[str, list[float]]:
    """What a job's hops cost on the way, from ``start``, ``send`` and ``end`` lines, in
    workload ms: ``release``, each successor's send after its sender's last end of that
    job (completion recorded, successor placed and pushed); ``busy gap``, a busy
    worker's time from one task's end to its next pick, when that next one was sent
    before the end (its settling, ack, fetch and receipt); ``idle pick``, a task's pick
    after its send on a worker idle at the send (the wake-up)."""
    starts = {e["id"]: e for e in lines if e["kind"] == "start"}
    ends = {e["id"]: e["t"] for e in lines if e["kind"] == "end"}
    runs: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    by_job: dict[tuple[str, str], list[float]] = defaultdict(list)
    for tid, s in starts.items():
        if tid in ends:
            runs[s["worker"]].append((s["t"], ends[tid], float(s["sent"])))
            by_job[(str(s.get("job")), s["worker"])].append(ends[tid])
    out: dict[str, list[float]] = {"release": [], "busy gap": [], "idle pick": []}
    for e in lines:
        if e["kind"] == "send":
            before = [t for t in by_job.get((str(e.get("job")), e.get("by")), ()) if t <= e["t"]]
            if before:
                out["release"].append(1000 * (e["t"] - max(before)) / scale)
    for spans in runs.values():
        spans.sort()
        last_end = None
        for pick, end, sent in spans:
            if last_end is not None and sent <= last_end <= pick:
                out["busy gap"].append(1000 * (pick - last_end) / scale)
            elif last_end is None or last_end <= sent:
                out["idle pick"].append(1000 * (pick - sent) / scale)
            last_end = end if last_end is None else max(last_end, end)
    return out


def hops_report(lines: list[dict[str, Any]], scale: float) -> str:
    """:func:`hop_times` as lines of p50, p90 and mean."""
    out = ["what the hops cost (workload ms):"]
    for name, xs in hop_times(lines, scale).items():
        mean = sum(xs) / len(xs) if xs else float("nan")
        out.append(f"  {name:10s} n={len(xs):4d}  p50 {_q(xs, 0.5):6.1f}  "
                   f"p90 {_q(xs, 0.9):6.1f}  mean {mean:6.1f} ms")
    return "\n".join(out)
