"""The workloads shipped with compass-celery (the demo's and the benchmark's), as data.

The repository's ``dags/`` folder links to these files, so both paths name the same
workload; installed copies find them here.
"""

from importlib import resources
from pathlib import Path


def path(name: str) -> Path:
    """Path of a shipped workload file, e.g. ``path("edge-vision.json")``."""
    return Path(str(resources.files(__name__).joinpath(name)))
