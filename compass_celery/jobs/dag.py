"""``Dag``: a multi-model ML job built from Celery signatures, one model per node.

Inputs: a node with one predecessor receives that predecessor's result as its
first positional argument (like a chain). A join receives a list of its
predecessors' results, in the order the predecessors were given in ``after=``
(or the order of ``edge`` calls), as its first positional argument. Source
nodes get only their own arguments. ``get()`` on the job handle returns a dict
``{sink node: result}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.canvas import Signature

from ..dag_validation import DagValidationError, validate_dag
from ..needs import DECLARE_MODEL, TaskDeclarationError, batch_options, resolve_needs
from ..planner.batch import BatchSpec, batch_record
from ..planner.priority import PriorityError, resolve_priority
from ..planner.types import DagSpec, TaskSpec
from .canvas import Shape, app_of, canvas_result, walk_canvas
from .limits import node_input_bytes

#: Why a Dag never holds a cycle, said with every edge it refuses.
BACKWARDS = ("a node can only come after nodes already added, so edges point backwards "
             "and a Dag cannot hold a cycle")

if TYPE_CHECKING:
    from .eager import EagerJobHandle
    from .handle import JobHandle


@dataclass
class Node:
    """One DAG node: a signature, the model it needs, and its estimates."""

    name: str
    signature: Signature
    model: str | None
    exec_ms: float
    output_kb: float
    preds: list[str] = field(default_factory=list)
    #: The name of the Dag it was added to (a node is wired only within its own Dag).
    dag: str = field(default="", compare=False)
    #: Whether nobody declared its run time: submission then takes the learned one.
    learn: bool = False
    #: Its task's ``compass_batch`` (``planner.batch``); None: unbatched.
    batch: BatchSpec | None = None


class Dag:
    """Build, validate and submit a job DAG on a Compass-enabled app."""

    def __init__(self, app: Celery, name: str = "dag") -> None:
        if not hasattr(app, "compass"):
            raise DagValidationError("Dag needs an app with Compass(app) installed")
        self.app, self.name = app, name
        self.nodes: dict[str, Node] = {}

    def node(self, name: str, sig: Signature, *, after: Iterable[str | Node] = (),
             model: str | None = None, exec_ms: float | None = None,
             output_kb: float | None = None) -> Node:
        """Add node ``name`` running ``sig`` after the given predecessors."""
        if not isinstance(name, str) or not name:
            raise DagValidationError(f"DAG {self.name!r}: node names must be non-empty strings")
        if name in self.nodes:
            raise DagValidationError(f"DAG {self.name!r}: duplicate node name {name!r}")
        if not isinstance(sig, Signature):
            raise DagValidationError(f"DAG {self.name!r}: node {name!r} needs a Celery "
                                     f"signature (task.s(...)), got {type(sig).__name__}")
        preds = [self._own(p, name) for p in after]
        for pred in preds:
            if pred == name:
                raise DagValidationError(
                    f"DAG {self.name!r}: node {name!r} cannot come after itself: {BACKWARDS}")
            if pred not in self.nodes:
                raise DagValidationError(f"DAG {self.name!r}: node {name!r} comes after "
                                         f"missing node {pred!r} ({BACKWARDS})")
        task = self.app.tasks.get(sig.task)
        if task is None:
            raise DagValidationError(f"DAG {self.name!r}: node {name!r} names unknown task "
                                     f"{sig.task!r}")
        node_input_bytes(self.name, name, {"task": sig.task, "args": list(sig.args or ()),
                                           "kwargs": dict(sig.kwargs or {})})
        call = {k: v for k, v in (("model", model), ("exec_ms", exec_ms),
                                  ("output_kb", output_kb)) if v is not None}
        call.update((sig.options or {}).get("compass") or {})
        c = self.app.compass
        try:
            needs = resolve_needs(sig.task, task, {"compass": call}, {},
                                    c.settings.default_exec_ms)
        except TaskDeclarationError as exc:
            raise DagValidationError(f"DAG {self.name!r}: node {name!r}: {exc}") from None
        known = c.model_sizes()
        if needs is not None and needs.model is not None and needs.model not in known:
            raise DagValidationError(
                f"DAG {self.name!r}: node {name!r} needs model {needs.model!r}, which is not "
                f"in the model catalogue ({', '.join(sorted(known)) or 'empty'}): "
                f"{DECLARE_MODEL}")
        node = Node(name, sig, needs.model if needs else None,
                    needs.exec_ms if needs else c.settings.default_exec_ms,
                    needs.output_kb if needs else 0.0, dag=self.name,
                    learn=needs is None or needs.exec_source == "default",
                    batch=needs.batch if needs else None)
        self.nodes[name] = node
        for pred in preds:
            self.edge(pred, name)
        return node

    def edge(self, pred: str | Node, succ: str | Node) -> None:
        """Make ``succ`` wait for ``pred``; refuses a missing node or a duplicate edge."""
        a, b = self._own(pred, "edge"), self._own(succ, "edge")
        for end in (a, b):
            if end not in self.nodes:
                raise DagValidationError(f"DAG {self.name!r}: edge {a!r} -> {b!r} refers to "
                                         f"missing node {end!r} ({BACKWARDS})")
        if a == b or self._runs_before(b, a):
            raise DagValidationError(f"DAG {self.name!r}: edge {a!r} -> {b!r} would close a "
                                     f"cycle ({b!r} already runs before {a!r}): a Dag has none")
        if a in self.nodes[b].preds:
            raise DagValidationError(f"DAG {self.name!r}: duplicate edge {a!r} -> {b!r}")
        self.nodes[b].preds.append(a)

    def _own(self, ref: str | Node, wiring: str) -> str:
        """The name of ``ref``, refused when it is a node of another Dag: wired by name,
        it would join this Dag's node of the same name and compute from the wrong input."""
        if not isinstance(ref, Node):
            return ref
        if self.nodes.get(ref.name) is not ref:
            what = "an edge" if wiring == "edge" else f"node {wiring!r}"
            raise DagValidationError(
                f"DAG {self.name!r}: {what} refers to node {ref.name!r} of DAG "
                f"{ref.dag or '?'!r}, not of this DAG; a Dag is wired only to its own "
                f"nodes (pass this DAG's node, or its name)")
        return ref.name

    def _runs_before(self, first: str, then: str) -> bool:
        """Whether ``first`` is ``then`` or one of its predecessors, however far back."""
        seen, todo = set(), [then]
        while todo:
            node = todo.pop()
            if node == first:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(self.nodes[node].preds)
        return False

    def spec(self) -> DagSpec:
        """The planner's view of this DAG (validated)."""
        c = self.app.compass
        aware = c.settings.batch_aware
        spec = DagSpec(
            nodes={n.name: TaskSpec(n.name, n.model, n.exec_ms, n.output_kb,
                                    batch=n.batch if aware else None)
                   for n in self.nodes.values()},
            edges=tuple((p, n.name) for n in self.nodes.values() for p in n.preds),
            name=self.name)
        return validate_dag(spec, known_models=c.model_sizes(),
                            max_nodes=c.settings.max_dag_nodes)

    def records(self, spec: DagSpec, priority: Any = None) -> dict[str, dict[str, Any]]:
        """Each node as plain JSON data (task, arguments, model, estimates, edges, priority
        level): what submission stores and what eager mode runs, so neither needs the Dag
        itself. A node's own ``.set(priority=...)`` wins over the job's ``priority``."""
        classes = self.app.compass.settings.priority_classes
        out = {}
        for name, node in self.nodes.items():
            sig = node.signature
            self._check_batched(name, node)
            own = (sig.options or {}).get("priority")
            try:
                level = resolve_priority(own if own is not None else priority, classes)
            except PriorityError as exc:
                raise DagValidationError(f"DAG {self.name!r}: node {name!r}: {exc}") from None
            out[name] = {"task": sig.task, "args": list(sig.args or ()),
                         "kwargs": dict(sig.kwargs or {}), "model": node.model,
                         "exec_ms": node.exec_ms, "output_kb": node.output_kb,
                         "preds": list(node.preds), "succs": spec.succs(name),
                         "learn": node.learn,
                         "priority": level, "batch": batch_record(node.batch)}
        return out

    def _check_batched(self, name: str, node: Node) -> None:
        """A batched task's node takes one input: a source its one argument, a node after
        others its predecessors' result and nothing of its own. Checked when the Dag is
        sent (its edges are known then), not when the node runs."""
        sig = node.signature
        if batch_options(self.app.tasks.get(sig.task)) is None:
            return
        own, kwargs = len(sig.args or ()), dict(sig.kwargs or {})
        if own + (1 if node.preds else 0) == 1 and not kwargs:
            return
        raise DagValidationError(
            f"DAG {self.name!r}: node {name!r}: task {sig.task!r} is batched "
            f"(compass_batch) and takes one input: a first node its one argument "
            f"(task.s(x)), a node after others its predecessors' result and no argument "
            f"of its own (task.s()); got {own} argument(s) of its own"
            f"{f' and keyword arguments {sorted(kwargs)}' if kwargs else ''}"
            f"{f' after {len(node.preds)} predecessor(s)' if node.preds else ''}")

    def apply_async(self, *, timeout_s: float | None = None, priority: Any = None,
                    deadline_ms: float | None = None, slo: str | None = None,
                    on_miss: str | None = None, alternative: Dag | None = None
                    ) -> JobHandle | EagerJobHandle:
        """Plan the whole job, send its sources, and return a handle at once; an eager
        app runs the job inline and returns its finished handle.

        ``priority`` (a level 0..9, 9 most urgent, or a class name) is every node's unless
        it set its own. ``deadline_ms`` (from now) or ``slo`` (a class of
        ``compass_slo_classes``: deadline, what to do on a miss, priority) give the job a
        deadline: a job the plan says will miss it raises
        :class:`~compass_celery.errors.Rejected` before anything is written or sent
        (``on_miss='late'``: it is taken and marked late; ``'degrade'``: ``alternative``,
        a cheaper Dag, is tried in its place). Once admitted, a job that falls behind is
        dropped before its next node runs (``JobHandle.get`` raises
        :class:`~compass_celery.errors.DeadlineMissed`). Eager mode runs every job.

        A job Redis refuses (a wrong password, an ACL) raises
        :class:`~compass_celery.errors.SendFailed` at once, as a plain task's send does;
        one Redis never answered for ``compass_submit_retry_s`` before anything was
        written raises it then (nothing was sent: sending it again is safe)."""
        from ..admission import slo_of
        from ..errors import Rejected
        from ..planner.admission import DEGRADE, REJECT
        from .eager import run_eagerly
        from .retry import refusal
        from .submit import not_sent, submit

        spec = self.spec()
        c = self.app.compass
        job_slo = slo_of(c, slo, deadline_ms, on_miss)
        if priority is None and job_slo is not None:
            priority = job_slo.priority
        eager = c.eager
        c.follow_mode(eager)
        if eager:
            return run_eagerly(c, spec, self.records(spec, priority))
        try:
            return submit(c, spec, self.records(spec, priority), timeout_s=timeout_s,
                          slo=job_slo)
        except Rejected:
            if alternative is None or job_slo is None or job_slo.on_miss != DEGRADE:
                raise
        except Exception as exc:
            cause = refusal(exc)  # a wrong password or ACL: no retry gets it in
            if cause is None:
                raise
            raise not_sent(c, spec.name, f"refused it: {type(cause).__name__}: {cause}") \
                from exc
        return alternative.apply_async(timeout_s=timeout_s, priority=priority,
                                       deadline_ms=job_slo.deadline_ms, slo=slo,
                                       on_miss=REJECT)

    @classmethod
    def from_spec(cls, app: Celery, spec: DagSpec, *, task: str, step_task: str,
                  args: Mapping[str, Any] | None = None, declare_exec_ms: bool = True,
                  batched: Mapping[str, str] | None = None) -> Dag:
        """A Dag of a workload template (the benchmark's, a workload file's): sources run
        ``task(model, exec_ms, data)``, other nodes ``step_task(inputs, model, exec_ms)``;
        both are task names of ``app``. With ``declare_exec_ms`` off the template's run
        times are not declared to the planner, which learns them from measured runs.
        ``batched`` maps a node to the batched task it runs instead (``compass_batch``:
        one input per call, ``data`` for a source, the inputs for the others)."""
        dag = cls(app, spec.name)
        for name in spec.topological_order():
            t = spec.nodes[name]
            if name in (batched or {}):
                sig = app.signature(batched[name], args=() if spec.preds(name)  # type: ignore[index]
                                    else ((args or {}).get(name),))
            elif spec.preds(name):
                sig = app.signature(step_task, args=(t.model, t.exec_ms))
            else:
                sig = app.signature(task, args=(t.model, t.exec_ms, (args or {}).get(name)))
            dag.node(name, sig, after=spec.preds(name), model=t.model,
                     exec_ms=t.exec_ms if declare_exec_ms else None, output_kb=t.output_kb)
        return dag

    @classmethod
    def from_file(cls, app: Celery, path: str | Path, dag_name: str, *, task: str,
                  step_task: str) -> Dag:
        """Load DAG template ``dag_name`` from a workload file (JSON or YAML); ``task`` and
        ``step_task`` as in :meth:`from_spec`."""
        from ..workload import load_workload

        workload = load_workload(path)
        if dag_name not in workload.dags:
            raise DagValidationError(f"{path}: no DAG named {dag_name!r}; it has "
                                     f"{sorted(workload.dags)}")
        return cls.from_spec(app, workload.dags[dag_name], task=task, step_task=step_task)

    @classmethod
    def from_canvas(cls, sig: Signature, name: str = "canvas", *, app: Celery | None = None
                    ) -> CanvasDag:
        """Plan a Celery canvas (chain, group, chord, nested) as one job; the app defaults
        to the canvas's tasks' app. See :mod:`compass_celery.jobs.canvas` for the mapping and
        :meth:`CanvasDag.canvas_result` for Celery's result shape."""
        app = app or app_of(sig)
        if app is None:
            raise DagValidationError(f"DAG {name!r}: the canvas has no task bound to an "
                                     "app; pass app=")
        dag = CanvasDag(app, name)
        dag.shape = walk_canvas(dag, sig)
        return dag


class CanvasDag(Dag):
    """A Dag built from a canvas; it remembers the canvas's result shape."""

    shape: Shape

    def canvas_result(self, job: Any, timeout: float | None = None) -> Any:
        """Wait for ``job`` (its handle) and return what Celery's ``apply_async().get()``
        returns for the canvas."""
        return canvas_result(self.name, self.shape, job.get(timeout=timeout))

    def result_of(self, results: Mapping[str, Any]) -> Any:
        """Celery's result for the canvas, from a job's ``{sink node: result}`` read
        elsewhere (rebuilding the Dag from the same canvas gives the same node names)."""
        return canvas_result(self.name, self.shape, results)
