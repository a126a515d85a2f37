"""The README's Layout table and docs/reference/layout.md name the package as it is.

The rule: every top-level module and every subpackage of ``compass_celery`` has a row in
the README's "## Layout" table, and every module (or nested subpackage) inside a subpackage
has a row under that subpackage's heading in docs/reference/layout.md. Neither may name a
module that does not exist. A row's first cell names paths in backticks: the first in full
(``compass_celery/errors.py``), the others relative to the first's folder (``signals.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "compass_celery"
README = ROOT / "README.md"
LAYOUT_PAGE = ROOT / "docs" / "reference" / "layout.md"


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n") + len(heading) + 1
    following = re.search(rf"^{level} ", text[start:], re.M)
    return text[start:start + following.start()] if following else text[start:]


def _first_cells(section: str) -> list[list[str]]:
    """The backticked names in each table row's first cell (header rows left out)."""
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("| ---"):
            continue
        rows.append(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return [names for names in rows if names]


def readme_paths(text: str) -> set[str]:
    """Package paths the README's Layout table names, as ``compass_celery/x.py`` or ``x/``."""
    found = set()
    for names in _first_cells(_section(text, "## Layout")):
        head = names[0]
        if not head.startswith("compass_celery/"):
            continue
        folder = head.rstrip("/").rsplit("/", 1)[0]
        found.update([head] + [f"{folder}/{name}" for name in names[1:]])
    return found


def page_entries(text: str, package: str) -> set[str]:
    """What the layout page's section for ``package`` (``planner``) names."""
    section = _section(text, f"## `compass_celery/{package}/`")
    return {name for names in _first_cells(section) for name in names}


def package_paths() -> set[str]:
    """Every top-level module and subpackage, as the README names them."""
    out = {f"compass_celery/{p.name}" for p in PACKAGE.glob("*.py")}
    return out | {f"compass_celery/{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py")}


def subpackage_entries(package: str) -> set[str]:
    """The modules and nested subpackages of one subpackage, ``__init__.py`` left out."""
    folder = PACKAGE / package
    modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    return modules | {f"{p.parent.name}/" for p in folder.glob("*/__init__.py")}


def missing_and_stale() -> list[str]:
    """Each disagreement between the package and the two tables, as a line to show."""
    problems = []
    named, actual = readme_paths(README.read_text()), package_paths()
    problems += [f"README Layout table misses {p}" for p in sorted(actual - named)]
    problems += [f"README Layout table names {p}, which does not exist"
                 for p in sorted(p for p in named - actual if not (ROOT / p).exists())]
    page = LAYOUT_PAGE.read_text()
    for sub in sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")):
        want = subpackage_entries(sub)
        if not want:
            continue
        try:
            listed = page_entries(page, sub)
        except ValueError:
            problems.append(f"{LAYOUT_PAGE.name} has no section for compass_celery/{sub}/")
            continue
        problems += [f"{LAYOUT_PAGE.name} misses compass_celery/{sub}/{m}"
                     for m in sorted(want - listed)]
        problems += [f"{LAYOUT_PAGE.name} names compass_celery/{sub}/{m}, which does not exist"
                     for m in sorted(listed - want - {"__init__.py"})]  # may be named
    return problems


def test_every_module_and_subpackage_is_in_the_tables() -> None:
    assert missing_and_stale() == []


def test_a_missing_module_is_caught(tmp_path: Path, monkeypatch) -> None:
    """The check is not vacuous: a module added to the package and to neither table, a
    top-level module dropped from the README, a row naming a gone module each show."""
    import tests.test_layout_table as table

    fake = tmp_path / "compass_celery"
    (fake / "planner").mkdir(parents=True)
    for path in ("__init__.py", "app.py", "errors.py", "signals.py", "planner/__init__.py",
                 "planner/cost.py", "planner/brand_new.py"):
        (fake / path).write_text('"""x"""\n')
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Layout\n\n| path | what |\n| --- | --- |\n"
                      "| `compass_celery/__init__.py` | names |\n"
                      "| `compass_celery/errors.py`, `signals.py` | errors; hooks |\n"
                      "| `compass_celery/planner/` | pure |\n\n## Next\n\n"
                      "| `compass_celery/app.py` | outside the section: does not count |\n")
    page = tmp_path / "layout.md"
    page.write_text("# x\n\n## `compass_celery/planner/`\n\n| module | what |\n| --- | --- |\n"
                    "| `cost.py`, `gone.py` | terms |\n")
    monkeypatch.setattr(table, "ROOT", tmp_path)
    monkeypatch.setattr(table, "PACKAGE", fake)
    monkeypatch.setattr(table, "README", readme)
    monkeypatch.setattr(table, "LAYOUT_PAGE", page)
    assert table.missing_and_stale() == [
        "README Layout table misses compass_celery/app.py",
        "layout.md misses compass_celery/planner/brand_new.py",
        "layout.md names compass_celery/planner/gone.py, which does not exist",
    ]


def test_the_layout_page_is_in_the_docs_site() -> None:
    assert "reference/layout.md" in (ROOT / "mkdocs.yml").read_text()
