"""compass-celery: Compass-style DAG- and GPU-cache-aware scheduling for Celery.

``Compass(app)`` installs everything on a Celery app; tasks declare the model
they need with ``@app.task(compass_model="name", compass_exec_ms=120)``.
"""

from .app import Compass
from .cache import get_model
from .placement import Decision, PlacementError

__version__ = "0.1.0"
__all__ = ["Compass", "Decision", "PlacementError", "get_model"]
