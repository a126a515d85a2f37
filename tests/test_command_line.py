"""One command line: every benchmark and tool is a click subcommand of ``compass-celery``
(and of ``celery compass``), and no module of the package parses its own arguments."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from compass_celery.cli import compass_command

PACKAGE = Path(__file__).resolve().parents[1] / "compass_celery"

#: The commands each group must have (a dropped one fails; a new one needs a help text).
COMMANDS = {
    (): {"status", "demo", "bench", "sim", "cache", "models", "device-check", "regress"},
    ("bench",): {"cluster", "overhead", "plan-timing", "producers", "flood", "soak",
                 "batching", "fault-table", "slo-table"},
    ("sim",): {"run", "batching", "generate"},
    ("cache",): {"hitrate"},
    ("models",): {"measure"},
}


def _sources() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_argparse() -> None:
    bad = []
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("argparse", "optparse", "getopt") for n in names):
                bad.append(str(path.relative_to(PACKAGE)))
    assert not bad, f"argument parsing outside click: {bad}"


def test_no_module_is_an_entry_point_of_its_own() -> None:
    """Only ``python -m compass_celery.cli`` (the script itself) runs as ``__main__``."""
    mains = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("__main__.py"))
    assert mains == ["cli/__main__.py"]
    guarded = []
    for path, tree in _sources().items():
        for node in tree.body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                guarded.append(str(path.relative_to(PACKAGE)))
    assert not guarded, f"modules run as scripts: {guarded}"


def _help(*path: str) -> str:
    result = CliRunner().invoke(compass_command, [*path, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def _listed(text: str) -> set[str]:
    """The command names under ``Commands:`` in a group's help."""
    lines = text.split("Commands:\n", 1)[1].splitlines()
    return {line.split()[0] for line in lines if line.startswith("  ") and line.strip()}


def _group(*path: str) -> click.Group:
    command: click.Command = compass_command
    for part in path:
        assert isinstance(command, click.Group)
        command = command.commands[part]
    assert isinstance(command, click.Group)
    return command


def test_help_lists_every_command_and_each_says_what_it_does() -> None:
    for group, expected in COMMANDS.items():
        registered = {n for n, c in _group(*group).commands.items() if not c.hidden}
        listed = _listed(_help(*group))
        assert listed == registered and expected <= listed, (group, listed)
        for name in listed:
            text = _help(*group, name)
            command = _group(*group).commands[name]
            assert command.help and len(command.help) > 30, (group, name)
            assert command.help.split()[0] in text


def test_options_before_a_subcommand_go_to_the_default_one() -> None:
    """``bench --workload W`` is ``bench cluster``; ``sim --workload W`` is ``sim run``."""
    bench = CliRunner().invoke(compass_command, ["bench", "--workload", "edge-vision",
                                                 "--redis", "redis://127.0.0.1:1/0",
                                                 "--jobs", "1"])
    assert bench.exit_code != 0 and "cannot reach Redis" in bench.output
    sim = CliRunner().invoke(compass_command, ["sim", "--workload", "nope-nothing.json"])
    assert sim.exit_code != 0 and "nope-nothing.json" in sim.output
    assert "Commands:" in _help("bench") and "Commands:" in _help("sim")


def test_the_script_and_celery_run_the_same_group() -> None:
    here = Path(__file__).resolve().parents[1]
    script = subprocess.run([sys.executable, "-m", "compass_celery.cli", "--help"],
                            capture_output=True, text=True, cwd=here, timeout=60)
    assert script.returncode == 0 and _listed(script.stdout) >= COMMANDS[()]
    celery = subprocess.run([sys.executable, "-m", "celery", "compass", "bench", "--help"],
                            capture_output=True, text=True, cwd=here, timeout=60)
    assert celery.returncode == 0, celery.stderr
    assert _listed(celery.stdout) >= COMMANDS[("bench",)]
