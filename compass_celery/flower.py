"""What Flower shows of a placement, riding on the message's ``argsrepr`` and ``kwargsrepr``.

Flower shows no extra fields of custom events, but it shows a task's args and kwargs
reprs in its task list, task page and REST API. When the message is published, a
short form (``[gpu0 · captioner · 120ms]``) goes in front of the args, near the front
of the task list, and the full line with the reason after the kwargs, on the task page;
a task with a deadline also shows its SLO class and how long it had when placed (or
``late``, when it was taken although the plan said it would miss);
a Dag node's args show where its inputs come from instead of the plumbing. Flower
needs no lookup of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .jobs.keys import JOB_HEADER, inputs_repr
from .planner.types import SHARED

#: Separates the task's own kwargs repr from the placement in ``kwargsrepr``.
REPR_MARK = " | compass: "
REASON_MAX = 120
#: The short form's place in front of ``argsrepr`` (a retry's earlier one is replaced).
_SHORT = re.compile(r"^\[[^\]]*\] ")


def _worker(c: Mapping[str, Any]) -> str:
    """The placed worker's name; ``shared`` for the shared queue, ``-`` if unknown."""
    worker = str(c.get("worker") or "-")
    return "shared" if worker == SHARED else worker


def _finish(c: Mapping[str, Any]) -> str:
    """The estimated finish in whole ms, ``-`` if missing or odd."""
    try:
        return f"{float(c['est_finish_ms']):.0f}ms"
    except (KeyError, TypeError, ValueError):
        return "-"


def _due_in(c: Mapping[str, Any]) -> str:
    """How long the task had to its deadline when placed (``380ms``); '' without one."""
    try:
        due, placed = float(c.get("due") or 0), float(c.get("queued_at") or 0)
    except (TypeError, ValueError):
        return ""
    return f"{max(0.0, due - placed) * 1000:.0f}ms" if due > 0 and placed > 0 else ""


def _due(c: Mapping[str, Any]) -> str:
    """``due in 380ms``, and ``late`` when admitted although the plan said it would miss;
    '' without a deadline."""
    due_in = _due_in(c)
    return ", ".join([*([f"due in {due_in}"] if due_in else []),
                      *(["late"] if c.get("late") else [])])


def describe_placement(compass: Mapping[str, Any] | None,
                       job: Mapping[str, Any] | None = None) -> str:
    """One short line from a ``compass`` header (and the job header, for moves).

    Pure and forgiving: any field may be missing or odd (a header from an older
    producer), and the line still renders, with ``-`` for what is unknown.
    """
    c = compass if isinstance(compass, Mapping) else {}
    j = job if isinstance(job, Mapping) else {}
    parts = [f"worker={_worker(c)}"]
    if c.get("model"):
        parts.append(f"model={c['model']}")
    parts.append(f"policy={c.get('policy') or '-'}")
    parts.append(f"est_finish={_finish(c)}")
    parts.append(f"moved_from={j.get('moved_from') or '-'}")
    if c.get("fallback"):
        parts.append("fallback=yes")
    if c.get("slo"):
        parts.append(f"slo={c['slo']}")
    if _due_in(c):
        parts.append(f"due_in={_due_in(c)}")
    if c.get("late"):
        parts.append("late=yes")
    reason = " ".join(str(c.get("reason") or "-").split())
    if len(reason) > REASON_MAX:
        reason = reason[:REASON_MAX - 3] + "..."
    parts.append(f"reason={reason}")
    return "compass: " + " ".join(parts)


def short_placement(compass: Mapping[str, Any] | None) -> str:
    """``gpu0 · captioner · 120ms``: worker, model and estimated finish, ``-`` if unknown;
    with a deadline, its SLO class and how long it had (``· interactive due in 380ms``)."""
    c = compass if isinstance(compass, Mapping) else {}
    parts = [_worker(c), str(c.get("model") or "-"), _finish(c)]
    slo = " ".join(p for p in (str(c.get("slo") or ""), _due(c)) if p)
    return " · ".join([*parts, slo] if slo else parts)


def _args_repr(args: Any, original: Any) -> str:
    """The args as Flower should show them: a node's input reference as the nodes it
    reads, everything else as Celery's own repr had it."""
    shown = inputs_repr(args)
    if shown is not None:
        return shown
    return _SHORT.sub("", original) if isinstance(original, str) else repr(tuple(args or ()))


def annotate_headers(headers: dict[str, Any], args: Any = None) -> None:
    """Put the placement into ``headers["argsrepr"]`` (short, in front) and
    ``headers["kwargsrepr"]`` (whole, after) when a ``compass`` header is there; ``args``
    are the message's arguments.

    With message protocol 2 the worker's ``task-received`` event reports
    ``kwargsrepr`` as the task's kwargs, so Flower's task list, task page and REST
    API show the placement with no lookup of their own. The original repr stays in
    front; a placement from an earlier annotation (a re-placed retry) is replaced,
    not stacked. Without a ``compass`` header nothing changes.
    """
    if not isinstance(headers, dict) or not headers.get("compass"):
        return
    if args is not None or isinstance(headers.get("argsrepr"), str):
        shown = _args_repr(args, headers.get("argsrepr"))
        headers["argsrepr"] = f"[{short_placement(headers.get('compass'))}] {shown}"
    line = describe_placement(headers.get("compass"), headers.get(JOB_HEADER))
    original = headers.get("kwargsrepr")
    if not isinstance(original, str):
        headers["kwargsrepr"] = line
        return
    original = original.split(REPR_MARK, 1)[0]
    if original.startswith("compass: "):  # annotated earlier with no kwargs repr
        original = ""
    headers["kwargsrepr"] = f"{original} | {line}" if original else line
