"""Workflow definitions in the workload format (see README.md here); data files only."""

from importlib import resources
from pathlib import Path


def path(name: str) -> Path:
    """Path of a packaged workload file, e.g. ``path("edge-vision.json")``."""
    return Path(str(resources.files(__name__).joinpath(name)))
