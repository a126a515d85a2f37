"""Per-node trace lines, for finding where real waits run past their plans (off by
default: set ``COMPASS_TRACE_DIR`` in the workers' environment to turn it on).

Each worker process appends JSON lines to ``$COMPASS_TRACE_DIR/<pid>.jsonl``:

- ``send``: a successor this worker released and sent: its planned and chosen worker,
  the age of the snapshot its placement read, and what that snapshot said about the
  chosen worker (what was left of its backlog, what ran, what waited per level);
- ``start``: a task this worker started: when it was sent, when it was picked, and what
  this worker ran between the two (each span's level, node, start and end relative to
  the send), so a wait past plan is seen next to what took the worker meanwhile;
- ``expired``: a task dropped unrun past its latest start, with the same spans;
- ``end``: a task's run ended here (``t``), so a successor's release and a busy worker's
  gap between tasks can be timed from it.

``compass-celery bench trace-waits`` joins them by task id. Nothing here decides anything; with
the variable unset every call returns at once. The variable is read once, at import (every
hook sits on a task's hot path); :func:`configure` reads it again (each compass app's
configuration load calls it, and tests that set it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any

TRACE_ENV = "COMPASS_TRACE_DIR"
#: How many of this worker's recent runs are kept to say what ran while a task waited.
RECENT = 64

_lock = threading.Lock()
_recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
_open: dict[str, dict[str, Any]] = {}
_file: Any = None
_pid: int | None = None


def _from_env() -> str | None:
    """The trace directory the environment names (an empty value: none)."""
    return os.environ.get(TRACE_ENV) or None


#: Where this process writes its lines; None: not tracing.
_dir: str | None = _from_env()


def configure() -> None:
    """Read ``COMPASS_TRACE_DIR`` again (it is read once, at import, to keep its lookup off
    the hot path): for a test or a program that sets it after importing this module."""
    global _dir, _file
    directory = _from_env()
    with _lock:  # not while a hook writes to the file this may close
        if directory != _dir and _file is not None:
            _file.close()
            _file = None
        _dir = directory


def enabled() -> bool:
    """Whether this process traces."""
    return _dir is not None


def _write(line: dict[str, Any]) -> None:
    global _file, _pid
    pid = os.getpid()
    if _file is None or _pid != pid:  # first line, or a forked child: a file of its own
        _file = open(os.path.join(_dir or ".", f"{pid}.jsonl"), "a")  # noqa: SIM115
        _pid = pid
    _file.write(json.dumps(line) + "\n")
    _file.flush()


def event(kind: str, **fields: Any) -> None:
    """Append one line of ``kind`` with ``fields`` (and the wall time ``t``)."""
    if _dir is None:
        return
    with _lock:
        _write({"kind": kind, "t": time.time(), **fields})


def _between(sent: float, picked: float, own: str) -> list[dict[str, Any]]:
    """This worker's runs that overlapped ``[sent, picked]`` (not ``own``), times in real
    ms from ``sent`` (an end of None: still running)."""
    out = []
    for span in list(_recent) + list(_open.values()):
        if span["id"] == own:
            continue
        end = span.get("end")
        if span["start"] < picked and (end is None or end > sent):
            out.append(
                {
                    **{k: v for k, v in span.items() if k not in ("start", "end")},
                    "start_ms": round(1000 * (span["start"] - sent), 1),
                    "end_ms": None if end is None else round(1000 * (end - sent), 1),
                }
            )
    return out


def _waited(kind: str, t: float, task_id: str, worker: str, level: int | None,
            job: dict[str, Any], sent: float, **extra: Any) -> dict[str, Any]:
    """A ``start`` or ``expired`` line: the task, its job's node, and what ran on this
    worker from its send to ``t``."""
    return {"kind": kind, "t": t, "id": task_id, "worker": worker, "level": level,
            "job": job.get("id"), "node": job.get("node"), **extra, "sent": sent,
            "ran_between": _between(sent, t, task_id)}


def started(
    task_id: str,
    worker: str,
    level: int | None,
    job: dict[str, Any] | None,
    picked: float,
    task: str = "",
) -> None:
    """A task starts on this worker: write what ran here since it was sent."""
    if _dir is None:
        return
    job = job if isinstance(job, dict) else {}
    sent = float(job.get("sent") or picked)
    with _lock:
        _write(_waited("start", picked, task_id, worker, level, job, sent, task=task,
                       due=job.get("due"), tail_ms=job.get("tail_ms")))
        _open[task_id] = {
            "id": task_id,
            "level": level,
            "node": job.get("node"),
            "job": job.get("id"),
            "start": picked,
        }


def ended(task_id: str, at: float) -> None:
    """A task ends on this worker: kept as one of its recent runs."""
    if _dir is None:
        return
    with _lock:
        span = _open.pop(task_id, None)
        if span is not None:
            span["end"] = at
            _recent.append(span)
        _write({"kind": "end", "t": at, "id": task_id})


def expired(task_id: str, worker: str, level: int | None, job: dict[str, Any] | None) -> None:
    """A task is dropped unrun past its latest start: write what ran here since it was
    sent."""
    if _dir is None:
        return
    job = job if isinstance(job, dict) else {}
    now = time.time()
    with _lock:
        _write(_waited("expired", now, task_id, worker, level, job,
                       float(job.get("sent") or now)))
