"""Every setting the code reads by name is a declared one: each ``settings["x"]``,
``cfg["x"]`` and ``settings.get("x")`` in ``compass_celery`` names an entry of
``compass_celery.settings.OPTIONS`` (a misspelt key would otherwise fail only when that
line first runs, as a bare KeyError)."""

from __future__ import annotations

import ast
from pathlib import Path

from compass_celery.settings import OPTIONS

PACKAGE = Path(__file__).resolve().parents[1] / "compass_celery"
#: The names the resolved settings go by where they are read.
HOLDERS = ("settings", "cfg")


def _holder(node: ast.expr) -> str | None:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if name in HOLDERS else None


def keys_read(source: str) -> list[tuple[int, str]]:
    """(line, key) of each setting read by a constant name in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _holder(node.value) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and _holder(node.func.value) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value))
    return found


def test_every_setting_read_by_name_is_declared() -> None:
    undeclared = [f"{path.relative_to(PACKAGE.parent)}:{line}: {key!r}"
                  for path in sorted(PACKAGE.rglob("*.py"))
                  for line, key in keys_read(path.read_text()) if key not in OPTIONS]
    assert undeclared == [], "not in settings.OPTIONS: " + ", ".join(undeclared)


def test_the_scan_sees_each_form() -> None:
    source = ("def f(c, cfg):\n"
              "    return c.settings['speed'], cfg['sped'], c.settings.get('seed'), x['no']\n")
    assert sorted(keys_read(source)) == [(2, "seed"), (2, "sped"), (2, "speed")]
