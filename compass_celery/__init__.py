"""compass-celery: Compass-style DAG- and GPU-cache-aware scheduling for Celery."""

__version__ = "0.1.0"
