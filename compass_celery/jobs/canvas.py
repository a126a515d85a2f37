"""Plan the canvases Celery users already write (chain, group, chord) as one :class:`Dag`.

A canvas is walked once into Dag nodes and edges, so a migrated job is planned
whole instead of being released step by step by Celery's callbacks:

- a chain adds its steps one after another: each step's entry tasks run after
  the previous step and receive its result as their first argument;
- a group adds its members side by side, all after the same predecessors;
- a chord adds its header as a group and its body after every header task; the
  body receives the list of header results, which is both Celery's chord and
  the Dag's join.

Nodes are named after their task (the last dotted part), made unique in walk
order (``resize``, ``resize-2``), so the same canvas always yields the same names.

``JobHandle.get()`` returns ``{sink node: result}``; :func:`canvas_result` maps it
to what Celery's ``canvas.apply_async().get()`` returns for the same canvas: the
last task's result for a chain, a list in member order for a group (groups
written directly inside a group are flattened, as Celery does), the body's result
for a chord, nested accordingly. The walk records that shape as it goes.

Shapes whose Celery meaning a Dag cannot reproduce raise
:class:`DagValidationError` naming where in the canvas they are and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from celery import Celery
from celery.canvas import Signature, _chain, _chord, group

from ..dag_validation import DagValidationError

__all__ = ["DagBuilder", "GroupShape", "app_of", "canvas_result", "walk_canvas"]


@dataclass(frozen=True)
class GroupShape:
    """A group's result: its members' results in order (a list, as Celery returns).

    ``flattened`` records that a group written directly inside it was spliced into
    it; Celery does the same for the final result, but numbers the inner members
    on their own, so such a list cannot be handed on to a later step in a defined
    order.
    """

    members: tuple[Shape, ...]
    flattened: bool = False


# A node name (one task's result) or a group of shapes.
Shape = str | GroupShape

# Celery's built-in tasks that loop over many calls of one task inside one worker
# (xmap, xstarmap, chunks): a planned job cannot place those calls one by one.
LOOP_TASKS = {"celery.map": "xmap (task.map)", "celery.starmap": "xstarmap (task.starmap)",
              "celery.chunks": "chunks (task.chunks)"}

# Options Celery acts on that a planned job cannot honour; the why is the message.
REFUSED_OPTIONS = {
    "link": "link callbacks are not part of the planned job; put the callback in the "
            "chain as a next step instead",
    "link_error": "link_error callbacks are not run by a planned job; a failed node fails "
                  "the whole job (JobFailed names the node), catch that instead",
    "countdown": "a planned node is sent as soon as its inputs are ready; countdown is not "
                 "supported",
    "eta": "a planned node is sent as soon as its inputs are ready; eta is not supported",
}


class DagBuilder(Protocol):
    """What a canvas walk adds nodes to: a :class:`~compass_celery.jobs.dag.Dag` (typed here
    as a Protocol so this module does not import dag.py, which imports it)."""

    app: Celery
    name: str
    nodes: Mapping[str, Any]

    def node(self, name: str, sig: Signature, *, after: Iterable[str] = ()) -> Any:
        """Add node ``name`` running ``sig`` after ``after``."""


def walk_canvas(dag: DagBuilder, sig: Any) -> Shape:
    """Add ``sig``'s tasks to ``dag`` as nodes and edges; return the canvas's result shape
    (see the module docstring); unsupported shapes raise DagValidationError."""
    return _Walk(dag).walk(sig, [], "canvas")


def canvas_result(name: str, shape: Shape, results: Mapping[str, Any]) -> Any:
    """Map a job's ``{sink node: result}`` to the value Celery returns for the canvas.

    Works on results read later by another process too: rebuilding the Dag from
    the same canvas gives the same node names.
    """

    def build(shape: Shape) -> Any:
        if isinstance(shape, str):
            if shape not in results:
                raise KeyError(f"canvas {name!r}: no result for node {shape!r} (results "
                               f"hold {sorted(results)})")
            return results[shape]
        return [build(m) for m in shape.members]

    return build(shape)


def app_of(sig: Any) -> Celery | None:
    """The app of the canvas's first task signature bound to one, if any."""
    for leaf in _leaves(sig):
        app = leaf._app or (leaf._type.app if leaf._type is not None else None)
        if app is not None:
            return app
    return None


def _leaves(sig: Any) -> Iterator[Signature]:
    if isinstance(sig, dict) and not isinstance(sig, Signature):
        sig = Signature.from_dict(sig)
    if isinstance(sig, _chord):
        yield from _leaves(sig.tasks)
        if sig.body is not None:
            yield from _leaves(sig.body)
    elif isinstance(sig, group | _chain):
        for task in sig.tasks:
            yield from _leaves(task)
    elif isinstance(sig, list | tuple):
        for task in sig:
            yield from _leaves(task)
    elif isinstance(sig, Signature):
        yield sig


class _Walk:
    """One walk of a canvas into ``dag``; ``where`` strings locate errors in the canvas."""

    def __init__(self, dag: DagBuilder) -> None:
        self.dag = dag
        self.used: set[str] = set()

    def sig(self, value: Any) -> Any:
        """A signature as is (not rebound to our app), a serialised one rebuilt."""
        if isinstance(value, dict) and not isinstance(value, Signature):
            return Signature.from_dict(value, app=self.dag.app)
        return value

    def refuse(self, where: str, what: str) -> DagValidationError:
        return DagValidationError(f"canvas {self.dag.name!r}: {where}: {what}")

    def walk(self, sig: Any, preds: list[str], where: str) -> Shape:
        """Add ``sig`` after ``preds`` (whose results are its input) and return its shape."""
        sig = self.sig(sig)
        if not isinstance(sig, Signature):
            raise self.refuse(where, f"expected a Celery signature, got {type(sig).__name__}")
        self.check_options(sig, where)
        if isinstance(sig, _chord):
            return self.chord(sig, preds, where)
        if isinstance(sig, group):
            return self.group(sig, preds, where)
        if isinstance(sig, _chain):
            return self.chain(sig, preds, where)
        if sig.task in LOOP_TASKS:
            raise self.refuse(where, f"{LOOP_TASKS[sig.task]} runs every call of "
                              f"{_inner_task(sig)!r} in a loop inside one built-in Celery task "
                              "on one worker, which compass cannot place call by call; write "
                              "the calls as a group of signatures instead")
        if sig.subtask_type is not None:
            raise self.refuse(where, f"unsupported canvas type {sig.subtask_type!r}")
        return self.task(sig, preds, where)

    def check_options(self, sig: Signature, where: str) -> None:
        for option, why in REFUSED_OPTIONS.items():
            if (sig.options or {}).get(option):
                raise self.refuse(where, f"{option!r} on {_label(sig)}: {why}")

    def task(self, sig: Signature, preds: list[str], where: str) -> str:
        if sig.immutable and preds:
            raise self.refuse(where, f"immutable signature {_label(sig)} (.si()) after another "
                              "step: a Dag node always receives its predecessors' results as "
                              "its first argument and has no way to ignore them; use .s() and "
                              "let the task accept (and ignore) that argument")
        name = self.unique(sig.task)
        try:
            self.dag.node(name, sig.clone(), after=preds)
        except DagValidationError as exc:  # say where in the canvas, not only the node
            raise self.refuse(where, str(exc)) from None
        return name

    def chain(self, sig: _chain, preds: list[str], where: str) -> Shape:
        steps = list(sig.tasks)
        if not steps:
            raise self.refuse(where, "empty chain: there is nothing to run")
        shape: Shape | None = None
        for i, step in enumerate(steps):
            step = self.sig(step)
            # Celery runs a one-member group in a chain as that member (maybe_unroll_group)
            while isinstance(step, group) and len(list(step.tasks)) == 1:
                step = self.sig(list(step.tasks)[0])
            here = f"{where} > chain step {i}"
            inputs = preds if shape is None else self.inputs(shape, here, chord=False)
            shape = self.walk(step, inputs, here)
        assert shape is not None
        return shape

    def group(self, sig: group, preds: list[str], where: str) -> GroupShape:
        members: list[Shape] = []
        flattened = False
        for i, task in enumerate(list(sig.tasks)):
            task = self.sig(task)
            here = f"{where} > group member {i}"
            shape = self.walk(task, preds, here)
            if isinstance(task, group):  # Celery splices a group written inside a group
                assert isinstance(shape, GroupShape)
                members.extend(shape.members)
                flattened = True
            else:
                members.append(shape)
        if not members:
            raise self.refuse(where, "empty group: there is nothing to run, and Celery would "
                              "hand a following step an empty list or skip the group; leave "
                              "the group out")
        return GroupShape(tuple(members), flattened)

    def chord(self, sig: _chord, preds: list[str], where: str) -> Shape:
        if sig.body is None:
            raise self.refuse(where, "chord without a body: give the body when building it "
                              "(chord(header, body))")
        extra = (sig.kwargs or {}).get("kwargs")
        if sig.args or extra:
            raise self.refuse(where, "partial arguments on a chord: put them in the header "
                              "tasks' own signatures")
        header = sig.tasks if isinstance(sig.tasks, group) else group(list(sig.tasks))
        shape = self.group(header, preds, f"{where} > chord header")
        inputs = self.inputs(shape, f"{where} > chord body", chord=True)
        return self.walk(sig.body, inputs, f"{where} > chord body")

    def inputs(self, shape: Shape, where: str, *, chord: bool) -> list[str]:
        """The nodes whose results make ``shape``'s value handed to the next step."""
        if isinstance(shape, str):
            return [shape]
        if shape.flattened:
            raise self.refuse(where, "a group written directly inside a group feeds this "
                              "step: Celery numbers the inner group's results on their own, "
                              "so their order in the list this step receives is not defined; "
                              "write one flat group")
        nested = [m for m in shape.members if not isinstance(m, str)]
        if nested:
            raise self.refuse(where, "a group member that itself ends in a group feeds this "
                              "step: Celery would hand it a list of lists, and a Dag join "
                              "receives a flat list of its predecessors' results; end that "
                              "member with a single task (a chord) instead")
        if chord and len(shape.members) == 1:
            raise self.refuse(where, "a chord header of a single task: Celery hands the body "
                              "a one-element list, but a Dag node after a single predecessor "
                              "receives the bare result; chain the two tasks instead")
        return [m for m in shape.members if isinstance(m, str)]

    def unique(self, task: str) -> str:
        base = task.rsplit(".", 1)[-1] or task
        name, n = base, 1
        while name in self.used or name in self.dag.nodes:
            n += 1
            name = f"{base}-{n}"
        self.used.add(name)
        return name


def _label(sig: Signature) -> str:
    return f"task {sig.task!r}" if sig.subtask_type is None else f"a {sig.subtask_type}"


def _inner_task(sig: Signature) -> str:
    inner = (sig.kwargs or {}).get("task")
    if isinstance(inner, dict):
        return str(inner.get("task"))
    return str(getattr(inner, "name", None) or sig.task)
