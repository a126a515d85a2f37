"""App config of the ``vision`` app."""

from django.apps import AppConfig


class VisionConfig(AppConfig):
    """The vision app: tasks in ``tasks.py``, HTTP API in ``views.py``."""

    name = "vision"
