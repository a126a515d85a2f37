"""The package's shape, checked from its source with ``ast``: which subpackage may import
which (the pure side not Celery's at any depth), no import cycles between modules or
between packages (type hints and imports inside functions included), no
imports of the example apps, no function too long to read at once, and a docstring
on every public name. Modules are split by concept, not by length: none is capped."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "compass_celery"
#: The longest function (or method), in lines from its ``def`` to its last line.
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """Every name ``name`` imports, at any depth of its tree, resolved to module names."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_pkg else base[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {d for d in _imported(m, p) if d in MODULES and d != m}
            for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    detail = [f"{' <-> '.join(c)}: " + "; ".join(
        f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(detail)


def test_the_package_does_not_import_its_examples() -> None:
    bad = {m: sorted(d for d in _imported(m, p) if d.split(".")[0] in ("workers", "dags"))
           for m, p in MODULES.items()}
    assert not {m: d for m, d in bad.items() if d}


def test_the_planner_imports_only_itself() -> None:
    """The planner is pure: no Celery, no Redis, nothing of the package outside it."""
    for m, p in MODULES.items():
        if m.startswith("compass_celery.planner"):
            inside = {d for d in _imported(m, p) if d.startswith("compass_celery")}
            assert all(d.startswith("compass_celery.planner") for d in inside), (m, inside)


CELERY_SIDE = ("celery", "kombu", "redis", "compass_celery.app", "compass_celery.router",
               "compass_celery.worker", "compass_celery.jobs", "compass_celery.broker",
               "compass_celery.state")

#: The Celery edges: what a user or the composition root touches, and the worker and job
#: runtimes. The lower layers (state, broker) and the pure core never import these.
EDGES = ("compass_celery.app", "compass_celery.router", "compass_celery.eager",
         "compass_celery.task_class",
         "compass_celery.placement", "compass_celery.worker", "compass_celery.jobs",
         "compass_celery.cli", "compass_celery.demo", "compass_celery.testing",
         "compass_celery.emulated", "compass_celery.emulated_app", "compass_celery.monitoring",
         "compass_celery.flower", "compass_celery.bench", "compass_celery.context")


def _within(module: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports_of(package: str) -> dict[str, set[str]]:
    return {m: _imported(m, p) for m, p in MODULES.items() if _within(m, package)}


#: The worker's pure core: the one part of ``worker/`` the simulator runs (it imports the
#: planner alone, and ``worker/__init__`` nothing, so importing it pulls in no Celery).
WORKER_CORE = "compass_celery.worker.core"


def test_planner_cache_and_simulator_stay_off_the_celery_side() -> None:
    """The simulator runs the real planner, cache and worker core: none of them may need
    Celery or Redis."""
    for package in ("compass_celery.planner", "compass_celery.cache", "compass_celery.sim",
                    WORKER_CORE):
        for m, deps in _imports_of(package).items():
            bad = sorted(d for d in deps if _within(d, CELERY_SIDE) and d != WORKER_CORE)
            assert not bad, f"{m} imports {bad}"


def test_the_worker_core_imports_only_the_planner() -> None:
    """So it is pure transitively: the planner imports only itself (tested above), and the
    worker package's ``__init__``, run on every import of the core, imports nothing."""
    inside = {d for d in _imported(WORKER_CORE, MODULES[WORKER_CORE])
              if d.startswith("compass_celery") or d.split(".")[0] in ("celery", "kombu",
                                                                      "redis", "torch")}
    assert inside and all(d.startswith("compass_celery.planner") for d in inside), inside
    assert not _imported("compass_celery.worker", MODULES["compass_celery.worker"])


#: The pure side: the simulator and all it runs (the planner, the cache, the workload parser,
#: the result record) and the worker's core. None of it may import Celery, kombu or Redis at
#: any depth: ``tests/test_purity.py`` runs the same imports with those blocked.
PURE = ("compass_celery.planner", "compass_celery.sim", "compass_celery.cache",
        "compass_celery.worker.core", "compass_celery.workload", "compass_celery.dag_validation",
        "compass_celery.results")
CELERY_LIBRARIES = ("celery", "kombu", "redis")


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module importing ``start`` loads, each with the module that brought it in:
    its imports at any depth, and the packages above each (their ``__init__`` runs too)."""
    came_from: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        v = todo.pop()
        parts = v.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))}
        for w in sorted(graph[v] | (parents & graph.keys())):
            if w not in came_from:
                came_from[w] = v
                todo.append(w)
    return came_from


def _chain(came_from: dict[str, str | None], module: str) -> str:
    path = [module]
    while (up := came_from[path[-1]]) is not None:
        path.append(up)
    return " <- ".join(path)


def test_the_reach_follows_imports_and_parent_packages() -> None:
    graph = {"p": {"x"}, "p.a": {"p.b"}, "p.b": set(), "x": set(), "y": set()}
    reach = _reach(graph, "p.a")
    assert set(reach) == {"p.a", "p.b", "p", "x"}
    assert _chain(reach, "x") == "x <- p <- p.a"


def test_the_pure_side_imports_no_celery_at_any_depth() -> None:
    """Not only its own imports: nothing it imports, nor what those import, is Celery's."""
    graph = _graph()
    bad: dict[str, str] = {}  # each offender once, with the first chain that reaches it
    for root in sorted(m for m in MODULES if _within(m, PURE)):
        reach = _reach(graph, root)
        for m in sorted(set(reach) - set(bad)):
            libs = sorted(d for d in _imported(m, MODULES[m]) if _within(d, CELERY_LIBRARIES))
            if libs:
                bad[m] = f"{_chain(reach, m)} imports {libs}"
    assert not bad, "the pure side reaches Celery:\n" + "\n".join(bad.values())


def _package(module: str) -> str:
    """The subpackage (or top-level module) of compass_celery that ``module`` is in."""
    return ".".join(module.split(".")[:2])


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_package(m), set()).update(
            _package(d) for d in deps if _package(d) != _package(m))
    return out


def test_no_package_imports_one_that_imports_it_back() -> None:
    """Modules may be acyclic while their packages are not: bench -> sim -> bench is a cycle."""
    graph = _graph()
    detail = []
    for cycle in _cycles(_package_graph(graph)):
        edges = {m: sorted(d for d in deps if _package(d) in cycle and _package(d) != _package(m))
                 for m, deps in sorted(graph.items()) if _package(m) in cycle}
        detail.append(f"{' <-> '.join(cycle)}: " + "; ".join(
            f"{m} imports {to}" for m, to in edges.items() if to))
    assert not detail, "package import cycles:\n" + "\n".join(detail)


def test_the_package_graph_joins_modules_by_package() -> None:
    graph = {"c.a.x": {"c.b.y"}, "c.b.y": {"c.a.z"}, "c.a.z": set()}
    assert _cycles(graph) == []
    assert _cycles(_package_graph(graph)) == [["c.a", "c.b"]]


@pytest.mark.parametrize("package", ["compass_celery.state", "compass_celery.broker"])
def test_state_and_broker_import_no_edge(package: str) -> None:
    """State and broker are the layers the edges stand on; they never reach back up."""
    for m, deps in _imports_of(package).items():
        bad = sorted(d for d in deps if _within(d, EDGES))
        assert not bad, f"{m} imports {bad}"


def test_jobs_do_not_import_the_worker() -> None:
    """A job completes through jobs/ alone: the worker calls into it, never the reverse."""
    for m, deps in _imports_of("compass_celery.jobs").items():
        bad = sorted(d for d in deps if _within(d, "compass_celery.worker"))
        assert not bad, f"{m} imports {bad}"


def test_the_layer_rules_catch_a_violation() -> None:
    assert _within("compass_celery.worker.runtime", EDGES)
    assert not _within("compass_celery.workload", EDGES)  # a prefix is not a package
    assert _within("compass_celery.state.keys", "compass_celery.state")


def _functions(tree: ast.AST) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_stay_short(module: str) -> None:
    long = [f"{name} ({n} lines)" for name, n in _functions(ast.parse(MODULES[module].read_text()))
            if n > MAX_FUNCTION_LINES]
    assert not long, f"{module}: over {MAX_FUNCTION_LINES} lines, cut them: {', '.join(long)}"


def test_the_function_length_rule_measures_whole_functions() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _functions(ast.parse(f"def f():\n{body}\n")) == [("f", MAX_FUNCTION_LINES + 1)]


def _undocumented(tree: ast.Module) -> list[str]:
    missing = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and not node.name.startswith("_"):
            if ast.get_docstring(node) is None:
                missing.append(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and not item.name.startswith("_") \
                            and ast.get_docstring(item) is None:
                        missing.append(f"{node.name}.{item.name}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    missing = {m: _undocumented(ast.parse(p.read_text())) for m, p in MODULES.items()}
    missing = {m: names for m, names in missing.items() if names}
    assert not missing, "public names without a docstring:\n" + "\n".join(
        f"{m}: {', '.join(names)}" for m, names in sorted(missing.items()))


def test_the_public_names_are_importable_from_the_top() -> None:
    """What the README and the docs import from ``compass_celery`` and its jobs face."""
    import compass_celery
    import compass_celery.jobs as jobs

    for name in compass_celery.__all__:
        assert getattr(compass_celery, name) is not None, name
    assert set(jobs.__all__) == {"Dag", "DagValidationError", "JobError", "JobFailed",
                                 "JobHandle", "JobTimeout", "RetriesExhausted"}
    assert jobs.Dag is compass_celery.Dag and jobs.JobHandle is compass_celery.JobHandle
