"""Eager mode for DAGs: run every node inline in topological order, with a recorded plan.

Same inputs shape and same results as the Redis runtime; no Redis is opened.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from ..errors import JobFailed
from ..planner.types import ClusterView, DagSpec
from .limits import check_submission, output_too_large

if TYPE_CHECKING:
    from ..context import CompassContext


class EagerJobHandle:
    """The result of an eagerly run DAG, with the same surface as :class:`JobHandle`."""

    def __init__(self, job_id: str, plan: dict[str, Any], results: dict[str, Any],
                 sinks: list[str], error: dict[str, Any] | None) -> None:
        self.id, self.plan, self.results, self.sinks, self.error = (
            job_id, plan, results, sinks, error)
        self.status = "FAILURE" if error else "SUCCESS"

    def ready(self) -> bool:
        """Always True: an eager job has ended before its handle exists."""
        return True

    def get(self, timeout: float | None = None, propagate: bool = True) -> dict[str, Any]:
        """The sink results ``{node: result}``; raises JobFailed (``timeout`` is unused)."""
        if self.error is not None:
            if propagate:
                raise JobFailed(self.error)
            return {}
        return {n: self.results[n] for n in self.sinks}

    def placement(self, readable: bool = False) -> dict[str, dict[str, Any]]:
        """Per node: the planned worker, which is also where it ran (nothing moves eagerly;
        ``readable`` changes nothing: there are no timings)."""
        return {n: {"planned": p, "worker": p, "moved": False} for n, p in self.plan.items()}


def run_eagerly(c: CompassContext, spec: DagSpec, nodes: dict[str, dict[str, Any]]
                ) -> EagerJobHandle:
    """Plan the job against in-process state, then run each node inline in order; the
    first failure ends the job as a failed node ends a real one, and the same size
    limits apply (:mod:`compass_celery.jobs.limits`)."""
    check_submission(c.settings, spec.name, nodes)
    snapshot = c.reader.get()
    plan: dict[str, Any] = {}
    if snapshot.workers:
        cluster = ClusterView.of(snapshot.workers, c.model_sizes(), snapshot.taken_at)
        plan = {n: p.worker for n, p in c.policy.plan(spec, cluster).placements.items()}
    results: dict[str, Any] = {}
    job_id = uuid.uuid4().hex
    for name in spec.topological_order():
        node = nodes[name]
        args = list(node["args"])
        if node["preds"]:
            inputs = [results[p] for p in node["preds"]]
            args.insert(0, inputs[0] if len(inputs) == 1 else inputs)
        task = c.app.tasks[node["task"]]
        res = task.apply(args=args, kwargs=dict(node["kwargs"]),
                         compass={k: v for k, v in (("model", node["model"]),
                                                   ("exec_ms", node["exec_ms"])) if v is not None})
        exc = res.result if res.failed() else _output_error(c, node["task"], res)
        if exc is not None:
            return EagerJobHandle(job_id, plan, results, spec.sinks(), {
                "job": job_id, "node": name, "task": node["task"], "task_id": res.id,
                "worker": plan.get(name), "exc_type": type(exc).__name__, "exc": str(exc)})
        results[name] = res.result
    return EagerJobHandle(job_id, plan, results, spec.sinks(), None)


def _output_error(c: CompassContext, task: str, res: Any) -> BaseException | None:
    """What a worker would fail the node with for this output (not JSON, or over
    ``compass_max_output_kb``), so an eager run passes only where a real one would."""
    try:
        output = json.dumps(res.result)
    except (TypeError, ValueError) as exc:
        return exc
    return output_too_large(c.settings, task, res.id, output)
