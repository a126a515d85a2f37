"""Size limits on what a job puts in Redis: each node's input, checked at submission, and
each node's output, checked as soon as its size is known.

An input travels in its node's message (and, for a node after others, in the job record
until the job expires); an output is kept in the job record for the job's TTL. Neither
is bounded by anything else, so one large job could fill Redis: both are refused with
an error naming the node, the size and the setting. The same checks run in eager mode,
and a plain task's arguments meet the same input limit when it is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kombu.utils import json as kombu_json

from ..dag_validation import DagValidationError
from ..needs import declared

if TYPE_CHECKING:
    from ..settings import CompassSettings

#: What to do about data over the limits, said with every refusal.
PASS_A_REFERENCE = ("pass a reference instead (a URL, an object-store key or a path the "
                    "workers can read)")


class JobInputTooLarge(DagValidationError):
    """A node's arguments (its input) are over ``compass_max_input_kb``."""


def input_bytes(node: Mapping[str, Any]) -> int:
    """The size of a node's own arguments as its message carries them (JSON)."""
    return len(json.dumps([node["args"], node["kwargs"]]))


def node_input_bytes(dag: str, name: str, node: Mapping[str, Any]) -> int:
    """:func:`input_bytes`, or a :class:`DagValidationError` naming the DAG and the node
    when its arguments are not JSON (a node's input travels as JSON, in its message and,
    after others, in the job record)."""
    try:
        return input_bytes(node)
    except (TypeError, ValueError) as exc:
        raise DagValidationError(
            f"DAG {dag!r}: node {name!r} ({node['task']}): its arguments are not JSON "
            f"({exc}); a node's input travels as JSON: pass numbers, strings, lists and "
            f"dicts, or a reference (a URL, an object-store key or a path)") from None


def input_too_large(settings: CompassSettings, what: str, size: int
                    ) -> JobInputTooLarge | None:
    """The error for an input of ``size`` bytes over ``compass_max_input_kb`` (``what``
    names whose: a job's node, a task), or None when it fits: one refusal for both."""
    limit = settings.max_input_kb
    if size <= limit * 1024:
        return None
    return JobInputTooLarge(f"{what} is {size / 1024:.0f} KB, over "
                            f"compass_max_input_kb={limit:g}: {PASS_A_REFERENCE}")


def check_task_input(settings: CompassSettings, task: Any, args: Any, kwargs: Any,
                     options: Mapping[str, Any]) -> None:
    """Refuse, before it is sent, a task compass places (declared, or given compass
    options) whose arguments are over ``compass_max_input_kb``, as a job's node is
    refused; sized as its message carries them (Celery's JSON). Arguments JSON cannot
    carry are left to Celery's own error."""
    if not (declared(task) or options.get("compass")):
        return
    try:
        size = len(kombu_json.dumps([list(args or ()), dict(kwargs or {})]))
    except (TypeError, ValueError):
        return
    error = input_too_large(settings, f"task {task.name!r} input (its arguments)", size)
    if error is not None:
        raise error


def check_submission(settings: CompassSettings, dag: str,
                     nodes: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a job, before anything is written or sent, whose node input is over
    ``compass_max_input_kb`` or whose node declares an output over ``compass_max_output_kb``
    (it would fail once run: refused while the size is known for free)."""
    max_out = settings.max_output_kb
    for name, node in nodes.items():
        error = input_too_large(settings, f"DAG {dag!r}: node {name!r} input "
                                f"({node['task']} arguments)", node_input_bytes(dag, name, node))
        if error is not None:
            raise error
        declared = float(node.get("output_kb") or 0.0)
        if declared > max_out:
            raise DagValidationError(
                f"DAG {dag!r}: node {name!r} ({node['task']}) declares an output of "
                f"{declared:.0f} KB, over compass_max_output_kb={max_out:g}: "
                f"{PASS_A_REFERENCE}")


def output_too_large(settings: CompassSettings, task: str | None, task_id: str,
                     output: str) -> ValueError | None:
    """The error for ``output`` (a node's result as JSON) over ``compass_max_output_kb``,
    naming the task and its id; None when it fits."""
    limit = settings.max_output_kb
    if len(output) <= limit * 1024:
        return None
    return ValueError(f"task {task}[{task_id}] output is {len(output) / 1024:.0f} KB, "
                      f"over compass_max_output_kb={limit:g}: {PASS_A_REFERENCE}")
