"""What Flower shows of a placement: one line riding on the message's ``kwargsrepr``.

Flower shows no extra fields of custom events, but it shows a task's kwargs repr
in its task list, task page and REST API; the placement is appended there when the
message is published, so Flower needs no lookup of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .jobs.keys import JOB_HEADER
from .planner.types import SHARED

#: Separates the task's own kwargs repr from the placement in ``kwargsrepr``.
REPR_MARK = " | compass: "
REASON_MAX = 120


def describe_placement(compass: Mapping[str, Any] | None,
                       job: Mapping[str, Any] | None = None) -> str:
    """One short line from a ``compass`` header (and the job header, for moves).

    Pure and forgiving: any field may be missing or odd (a header from an older
    producer), and the line still renders, with ``-`` for what is unknown.
    """
    c = compass if isinstance(compass, Mapping) else {}
    j = job if isinstance(job, Mapping) else {}
    worker = str(c.get("worker") or "-")
    if worker == SHARED:
        worker = "shared"
    parts = [f"worker={worker}"]
    if c.get("model"):
        parts.append(f"model={c['model']}")
    parts.append(f"policy={c.get('policy') or '-'}")
    try:
        parts.append(f"est_finish={float(c['est_finish_ms']):.0f}ms")
    except (KeyError, TypeError, ValueError):
        parts.append("est_finish=-")
    parts.append(f"moved_from={j.get('moved_from') or '-'}")
    if c.get("fallback"):
        parts.append("fallback=yes")
    reason = " ".join(str(c.get("reason") or "-").split())
    if len(reason) > REASON_MAX:
        reason = reason[:REASON_MAX - 3] + "..."
    parts.append(f"reason={reason}")
    return "compass: " + " ".join(parts)


def annotate_headers(headers: dict[str, Any]) -> None:
    """Put the placement into ``headers["kwargsrepr"]`` when a ``compass`` header is there.

    With message protocol 2 the worker's ``task-received`` event reports
    ``kwargsrepr`` as the task's kwargs, so Flower's task list, task page and REST
    API show the placement with no lookup of their own. The original repr stays in
    front; a placement from an earlier annotation (a re-placed retry) is replaced,
    not stacked. Without a ``compass`` header nothing changes.
    """
    if not isinstance(headers, dict) or not headers.get("compass"):
        return
    line = describe_placement(headers.get("compass"), headers.get(JOB_HEADER))
    original = headers.get("kwargsrepr")
    if not isinstance(original, str):
        headers["kwargsrepr"] = line
        return
    original = original.split(REPR_MARK, 1)[0]
    if original.startswith("compass: "):  # annotated earlier with no kwargs repr
        original = ""
    headers["kwargsrepr"] = f"{original} | {line}" if original else line
