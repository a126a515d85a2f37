"""The emulated-GPU worker app, as an example module: ``celery -A workers.emulated worker
-P solo --compass-emulate-gpu-mb 1600``. The tasks live in :mod:`compass_celery.emulated`."""

from compass_celery.emulated import EDGE_MODELS, make_app

__all__ = ["EDGE_MODELS", "app", "make_app"]

app = make_app()
