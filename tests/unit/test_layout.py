"""The package's shape, checked from its source with ``ast``: no import cycles (type
hints and imports inside functions included), no imports of the example apps, no
module too long to read at once, and a docstring on every public name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "compass_celery"
MAX_LINES = 400


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


def test_planner_cache_and_simulator_stay_off_the_celery_side() -> None:
    """The simulator runs the real planner and cache: none of them may need Celery or Redis."""
    pure = ("compass_celery.planner", "compass_celery.cache", "compass_celery.sim")
    for m, p in MODULES.items():
        if m.startswith(pure):
            bad = sorted(d for d in _imported(m, p)
                         if any(d == x or d.startswith(x + ".") for x in CELERY_SIDE))
            assert not bad, f"{m} imports {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines (over {MAX_LINES}): split it"


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
