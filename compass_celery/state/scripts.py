"""The Lua scripts shipped beside the code, read once per process.

Every atomic multi-key step compass takes in Redis is one of these scripts, so
the step is visible in one file and its KEYS/ARGV contract is written at its top.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def script(name: str) -> str:
    """The source of ``lua/<name>.lua``."""
    return resources.files("compass_celery").joinpath(f"lua/{name}.lua").read_text()
