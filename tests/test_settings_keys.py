"""Every setting the code reads by name is a declared one.

The settings are read by attribute from one frozen ``CompassSettings``
(``compass.settings.time_scale``, a worker's ``cfg.speed``), whose fields are made from
``compass_celery.settings.OPTIONS``; the scan here also covers the mapping reads still
allowed (``settings["x"]``, ``cfg.get("x")``), so a misspelt name fails in CI rather than
when its line first runs, as a bare AttributeError or KeyError."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from compass_celery.settings import OPTIONS, CompassSettings, resolve

PACKAGE = Path(__file__).resolve().parents[1] / "compass_celery"
#: The names the resolved settings go by where they are read.
HOLDERS = ("settings", "cfg")
#: What a settings object has besides its fields (its mapping view, ``replace``).
METHODS = frozenset({"get", "items", "keys", "values", "replace"})


def _holder(node: ast.expr) -> str | None:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if name in HOLDERS else None


def _const(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else None


def keys_read(source: str, attributes: bool = True) -> list[tuple[int, str]]:
    """(line, name) of each setting read by a constant name (or, with ``attributes``, as an
    attribute) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _holder(node.value) and _const(node.slice):
            found.append((node.lineno, _const(node.slice)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and _holder(node.func.value) and node.args \
                and _const(node.args[0]):
            found.append((node.lineno, _const(node.args[0])))
        elif attributes and isinstance(node, ast.Attribute) and _holder(node.value) \
                and node.attr not in METHODS:
            found.append((node.lineno, node.attr))
    return [(line, key) for line, key in found if key is not None]


def test_every_setting_read_by_name_is_declared() -> None:
    undeclared = [f"{path.relative_to(PACKAGE.parent)}:{line}: {key!r}"
                  for path in sorted(PACKAGE.rglob("*.py"))
                  for line, key in keys_read(path.read_text()) if key not in OPTIONS]
    assert undeclared == [], "not in settings.OPTIONS: " + ", ".join(undeclared)


def test_the_package_reads_settings_by_attribute_only() -> None:
    """The mapping view (``settings["x"]``) is kept for users' code; the package's own reads
    are attribute reads, whose names the dataclass and the scan above both check."""
    by_key = [f"{path.relative_to(PACKAGE.parent)}:{line}: settings[{key!r}]"
              for path in sorted(PACKAGE.rglob("*.py"))
              for line, key in keys_read(path.read_text(), attributes=False)]
    assert by_key == [], "read by attribute instead: " + ", ".join(by_key)


def test_the_scan_sees_each_form() -> None:
    source = ("def f(c, cfg):\n"
              "    return c.settings['speed'], cfg['sped'], c.settings.get('seed'), x['no']\n"
              "def g(c, cfg):\n"
              "    return c.settings.tim_scale, cfg.get, c.settings.replace(seed=1), y.z\n")
    assert sorted(keys_read(source)) == [(2, "seed"), (2, "sped"), (2, "speed"),
                                         (4, "tim_scale")]
    assert sorted(keys_read(source, attributes=False)) == [(2, "seed"), (2, "sped"),
                                                           (2, "speed")]


def test_the_typed_settings_have_one_field_per_declaration() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(CompassSettings)}
    assert list(fields) == list(OPTIONS)
    for name, opt in OPTIONS.items():
        types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
        assert set(getattr(fields[name], "__args__", (fields[name],))) == set(types), name


def test_the_typed_settings_are_frozen_and_refuse_an_unknown_name() -> None:
    s = resolve({"compass_time_scale": 2})
    assert s.time_scale == 2 and s["time_scale"] == 2 and s.queue_prefix == "compass.w."
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.time_scale = 3
    with pytest.raises(AttributeError):
        _ = s.tim_scale
    with pytest.raises(KeyError):
        _ = s["tim_scale"]
    assert s.replace(time_scale=3).time_scale == 3 and s.time_scale == 2
