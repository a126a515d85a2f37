"""Where one job lives in Redis, and the names its messages carry.

The job, its plan and its progress live under ``{prefix}:job:{<id>}`` (the templates,
with each key's type and writer, are in :mod:`compass_celery.state.keys`): the id is the
hash tag, so every key of one job is in
one Redis Cluster slot. These helpers are shared by submission, the worker-side
runtime, failure handling and the handle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..planner.pending import send_charge_ms
from ..planner.types import Placement
from ..state import keys as _keys

__all__ = ["INPUT_REF", "JOB_HEADER", "JobKeys", "deadlines_key", "inputs_repr", "once_keys",
           "placement_json", "planned_charge_ms"]

#: The message header a job node carries: job id, node name, inputs, where it moved from.
JOB_HEADER = _keys.JOB_HEADER

#: The first argument of a node with predecessors: where to find its inputs.
INPUT_REF = "__compass_inputs__"


def inputs_repr(args: Any) -> str | None:
    """A node's arguments as Flower shows them when the first is an input reference: the
    nodes it reads, then the rest (``(<outputs of a, b>, 'x')``); None for any other
    arguments (Celery's own repr stands). Built here, where the reference is defined,
    for the message's header and for Flower's annotation alike."""
    if isinstance(args, (list, tuple)) and args and isinstance(args[0], Mapping) \
            and isinstance(args[0].get(INPUT_REF), Mapping):
        preds = args[0][INPUT_REF].get("preds") or []
        rest = [repr(a) for a in args[1:]]
        return "(" + ", ".join([f"<outputs of {', '.join(map(str, preds))}>", *rest]) + ")"
    return None


@dataclass(frozen=True)
class JobKeys:
    """The Redis keys of one job."""

    job: str
    outputs: str
    left: str
    done: str
    info: str
    tasks: str

    @classmethod
    def of(cls, prefix: str, job_id: str) -> JobKeys:
        """The keys of job ``job_id`` under key prefix ``prefix``."""
        return cls(*(_keys.key(t, prefix, id=job_id) for t in (
            _keys.JOB, _keys.JOB_OUTPUTS, _keys.JOB_LEFT, _keys.JOB_DONE, _keys.JOB_INFO,
            _keys.JOB_TASKS)))

    def all(self) -> list[str]:
        """In the order complete.lua expects its KEYS."""
        return [self.job, self.outputs, self.left, self.done, self.info, self.tasks]


def deadlines_key(prefix: str) -> str:
    """The sorted set of running jobs by deadline, swept by every worker's recovery."""
    return _keys.key(_keys.JOB_DEADLINES, prefix)


def once_keys(prefix: str, token: str) -> list[str]:
    """once.lua's KEYS for ``token``: its guard, the state log, the change log and the
    counter hashes (backlog, queued, forming, pending), all in the cluster state's slot."""
    return [_keys.key(_keys.ONCE, prefix, token=token),
            _keys.key(_keys.STATE_LOG, prefix), _keys.key(_keys.CHANGES, prefix),
            *(_keys.key(template, prefix) for template, _ in _keys.COUNTERS.values())]


def placement_json(p: Placement) -> dict[str, Any]:
    """A plan entry as stored in the job record (and read back by complete.lua)."""
    return {"worker": p.worker, "queue": p.queue, "start_ms": p.start_ms,
            "finish_ms": p.finish_ms, "load_ms": p.load_ms, "run_ms": p.run_ms,
            "reason": p.reason, **({} if p.charge_ms is None else {"charge_ms": p.charge_ms}),
            **({"prefetch_ms": p.prefetch_ms} if p.prefetch_ms else {}),
            **({"hop_ms": p.hop_ms} if p.hop_ms else {})}


def planned_charge_ms(p: Mapping[str, Any]) -> float:
    """What a stored plan entry charges its worker: its run and its worker's per-task
    dispatch (pending while it waits for inputs, then its queue's backlog)."""
    return send_charge_ms(float(p.get("run_ms") or 0.0), float(p.get("hop_ms") or 0.0))
