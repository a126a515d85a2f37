"""Checks that a DAG is one the planner can run, with messages that name the culprit.

Pure (no I/O): the workload parser, the ``Dag`` builder and the simulator all
validate through here, so a bad node is reported the same way everywhere.
``dag_from_dict`` parses the workload format's DAG template and reports wrong
types by field path (``dags.document.nodes.ocr.exec_ms: expected a number, got 'fast'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import CompassInputError
from .planner.types import DagSpec, TaskSpec

MAX_NODES = 1000
MAX_EDGES = 20_000
MAX_NAME_LEN = 200
MAX_VALUE = 1e12  # no time, size or rate in a workload is larger; keeps sums finite
NODE_FIELDS = ("model", "exec_ms", "output_kb")


class DagValidationError(CompassInputError):
    """A DAG (or its template) is malformed; the message names the node, edge or field."""


def describe(value: Any) -> str:
    """A short, safe rendering of a bad value: never recurses into containers."""
    if isinstance(value, Mapping):
        return f"an object with {len(value)} keys"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} items"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return f"a {type(value).__name__}"


def number(value: Any, path: str, *, minimum: float = 0.0, positive: bool = False,
           error: type[CompassInputError] = DagValidationError) -> float:
    """A finite real number (never a bool) at or above ``minimum`` (above it if ``positive``).

    ``error`` is the class raised, so a workload field is reported as a WorkloadError
    without catching and re-raising.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{path}: expected a number, got {describe(value)}")
    try:
        out = float(value)
    except OverflowError:
        raise error(f"{path}: number too large") from None
    if not math.isfinite(out):
        raise error(f"{path}: expected a finite number, got {value!r}")
    if out > MAX_VALUE:
        raise error(f"{path}: {value!r} is larger than {MAX_VALUE:g}")
    if out < minimum or (positive and out <= minimum):
        word = "above" if positive else "at least"
        raise error(f"{path}: must be {word} {minimum:g}, got {value!r}")
    return out


def name_ok(value: Any, path: str,
            error: type[CompassInputError] = DagValidationError) -> str:
    """A non-empty string of bounded length, for node and model names (``error`` as above)."""
    if not isinstance(value, str):
        raise error(f"{path}: expected a name (string), got {describe(value)}")
    if not value.strip():
        raise error(f"{path}: name must be a non-empty string")
    if len(value) > MAX_NAME_LEN:
        raise error(f"{path}: name longer than {MAX_NAME_LEN} characters")
    return value


def _find_cycle(spec: DagSpec) -> list[str] | None:
    """Nodes on one cycle, in order, or None; iterative DFS so deep DAGs cannot overflow."""
    succs: dict[str, list[str]] = {n: [] for n in spec.nodes}
    for a, b in spec.edges:
        succs[a].append(b)
    colour = dict.fromkeys(spec.nodes, 0)  # 0 new, 1 on stack, 2 done
    for root in spec.nodes:
        if colour[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path = [root]
        colour[root] = 1
        while stack:
            node, i = stack[-1]
            if i < len(succs[node]):
                stack[-1] = (node, i + 1)
                nxt = succs[node][i]
                if colour[nxt] == 1:
                    return path[path.index(nxt) :] + [nxt]
                if colour[nxt] == 0:
                    colour[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                colour[node] = 2
                stack.pop()
                path.pop()
    return None


def validate_dag(
    spec: DagSpec,
    *,
    known_models: Mapping[str, float] | None = None,
    max_nodes: int = MAX_NODES,
    max_gpu_mb: float | None = None,
) -> DagSpec:
    """Return ``spec`` unchanged if the planner can run it, else raise DagValidationError."""
    where = f"DAG {spec.name!r}"
    if not isinstance(spec.nodes, Mapping) or not spec.nodes:
        raise DagValidationError(f"{where}: has no nodes")
    if len(spec.nodes) > max_nodes:
        raise DagValidationError(f"{where}: {len(spec.nodes)} nodes, more than {max_nodes}")
    for key, task in spec.nodes.items():
        name_ok(key, f"{where}: node name")
        if not isinstance(task, TaskSpec):
            raise DagValidationError(f"{where}: node {key!r} is {describe(task)}, not a TaskSpec")
        if task.name != key:
            raise DagValidationError(f"{where}: node {key!r} holds a task named {task.name!r}")
        for fld in ("exec_ms", "output_kb"):
            number(getattr(task, fld), f"{where}: node {key!r} field {fld}")
        if task.model is None:
            continue
        name_ok(task.model, f"{where}: node {key!r} field model")
        if known_models is not None and task.model not in known_models:
            raise DagValidationError(f"{where}: node {key!r} uses unknown model {task.model!r}")
        size = known_models.get(task.model) if known_models is not None else None
        if size is not None and max_gpu_mb is not None and size > max_gpu_mb:
            raise DagValidationError(
                f"{where}: node {key!r} model {task.model!r} needs {size:g} MB, "
                f"more than the largest GPU ({max_gpu_mb:g} MB)"
            )
    if len(spec.edges) > MAX_EDGES:
        raise DagValidationError(f"{where}: {len(spec.edges)} edges, more than {MAX_EDGES}")
    seen: set[tuple[str, str]] = set()
    for edge in spec.edges:
        if not isinstance(edge, tuple | list) or len(edge) != 2:
            raise DagValidationError(f"{where}: edge {describe(edge)} is not a pair")
        a, b = edge
        for end in (a, b):
            if not isinstance(end, str) or end not in spec.nodes:
                raise DagValidationError(
                    f"{where}: edge {describe(a)} -> {describe(b)} references "
                    f"missing node {describe(end)}"
                )
        if a == b:
            raise DagValidationError(f"{where}: self-loop on node {a!r}")
        if (a, b) in seen:
            raise DagValidationError(f"{where}: duplicate edge {a!r} -> {b!r}")
        seen.add((a, b))
    cycle = _find_cycle(spec)
    if cycle:
        raise DagValidationError(f"{where}: cycle through {' -> '.join(cycle)}")
    return spec


def _node(raw: Any, path: str, name: str) -> TaskSpec:
    if not isinstance(raw, Mapping):
        raise DagValidationError(f"{path}: expected an object, got {describe(raw)}")
    extra = [k for k in raw if k not in (*NODE_FIELDS, "name")]
    if extra:
        raise DagValidationError(
            f"{path}: unknown field {describe(extra[0])} (allowed: {', '.join(NODE_FIELDS)})"
        )
    model = raw.get("model")
    if model is not None:
        name_ok(model, f"{path}.model")
    if "exec_ms" not in raw:
        raise DagValidationError(f"{path}.exec_ms: missing")
    exec_ms = number(raw["exec_ms"], f"{path}.exec_ms")
    output_kb = number(raw.get("output_kb", 0.0), f"{path}.output_kb")
    return TaskSpec(name=name, model=model, exec_ms=exec_ms, output_kb=output_kb)


def _nodes(raw: Any, path: str) -> dict[str, TaskSpec]:
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, Mapping):
                raise DagValidationError(f"{path}[{i}]: expected an object, got {describe(entry)}")
            if "name" not in entry:
                raise DagValidationError(f"{path}[{i}].name: missing")
            items.append((name_ok(entry["name"], f"{path}[{i}].name"), entry))
    else:
        raise DagValidationError(f"{path}: expected an object or a list, got {describe(raw)}")
    if not items:
        raise DagValidationError(f"{path}: no nodes")
    if len(items) > MAX_NODES:
        raise DagValidationError(f"{path}: {len(items)} nodes, more than {MAX_NODES}")
    nodes: dict[str, TaskSpec] = {}
    for key, entry in items:
        key = name_ok(key, f"{path}: node name")
        if key in nodes:
            raise DagValidationError(f"{path}: duplicate node name {key!r}")
        nodes[key] = _node(entry, f"{path}.{key}", key)
    return nodes


def _edges(raw: Any, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        raise DagValidationError(f"{path}: expected a list of [from, to] pairs, got "
                                 f"{describe(raw)}")
    if len(raw) > MAX_EDGES:
        raise DagValidationError(f"{path}: {len(raw)} edges, more than {MAX_EDGES}")
    out = []
    for i, edge in enumerate(raw):
        if not isinstance(edge, list | tuple) or len(edge) != 2:
            raise DagValidationError(f"{path}[{i}]: expected a [from, to] pair, got "
                                     f"{describe(edge)}")
        out.append((name_ok(edge[0], f"{path}[{i}][0]"), name_ok(edge[1], f"{path}[{i}][1]")))
    return tuple(out)


def dag_from_dict(
    name: str,
    obj: Any,
    models: Mapping[str, float] | None,
    *,
    path: str | None = None,
    max_gpu_mb: float | None = None,
) -> DagSpec:
    """Parse one DAG template ``{"nodes": {...}, "edges": [[a, b], ...]}`` and validate it.

    ``path`` prefixes error messages (default ``dags.<name>``); ``models`` maps
    known model names to sizes in MB (None skips the unknown-model check).
    """
    path = path if path is not None else f"dags.{name}"
    if not isinstance(obj, Mapping):
        raise DagValidationError(f"{path}: expected an object, got {describe(obj)}")
    extra = [k for k in obj if k not in ("nodes", "edges", "description")]
    if extra:
        raise DagValidationError(
            f"{path}: unknown field {describe(extra[0])} (allowed: nodes, edges)"
        )
    if "nodes" not in obj:
        raise DagValidationError(f"{path}.nodes: missing")
    nodes = _nodes(obj["nodes"], f"{path}.nodes")
    edges = _edges(obj.get("edges", []), f"{path}.edges")
    for i, (a, b) in enumerate(edges):
        for j, end in enumerate((a, b)):
            if end not in nodes:
                raise DagValidationError(
                    f"{path}.edges[{i}][{j}]: edge {a!r} -> {b!r} references missing node {end!r}"
                )
    for key, task in nodes.items():
        if models is not None and task.model is not None and task.model not in models:
            raise DagValidationError(f"{path}.nodes.{key}.model: unknown model {task.model!r}")
    spec = DagSpec(nodes=nodes, edges=edges, name=name)
    return validate_dag(spec, known_models=models, max_gpu_mb=max_gpu_mb)
