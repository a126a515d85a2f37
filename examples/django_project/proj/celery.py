"""The project's Celery app, with Compass scheduling its per-worker queues.

Start a worker with an emulated GPU (no CUDA or torch needed)::

    celery -A proj worker -P solo -n gpu0@%h --compass-emulate-gpu-mb 4000

With ``COMPASS_EXAMPLE_MODELS=real`` (the setting, from the environment by default) the
app also runs the real pretrained models: start a worker on the CPU with a device budget::

    celery -A proj worker -P solo -n cpu0@%h --compass-gpu cpu --compass-device-mb 200
"""

import os

from celery import Celery
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from compass_celery import Compass

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

EXAMPLE_MODELS = ("emulated", "real")


def example_models() -> str:
    """The ``COMPASS_EXAMPLE_MODELS`` setting: "emulated" (the default) or "real"."""
    value = getattr(settings, "COMPASS_EXAMPLE_MODELS", "emulated")
    if value not in EXAMPLE_MODELS:
        raise ImproperlyConfigured(f"COMPASS_EXAMPLE_MODELS is {value!r}: use "
                                   f"{' or '.join(map(repr, EXAMPLE_MODELS))}")
    return value


app = Celery("proj")
# Every CELERY_* setting in proj/settings.py, CELERY_COMPASS_* included.
app.config_from_object("django.conf:settings", namespace="CELERY")
Compass(app)  # before the tasks are bound, so they get the Compass task class
#: Whether this app runs the real pretrained models (and serves POST /search/).
REAL_MODELS = example_models() == "real"
if REAL_MODELS:
    from compass_celery.pretrained.app import add_pretrained

    add_pretrained(app)  # all-MiniLM-L6-v2 and Silero VAD, with their tasks
app.autodiscover_tasks()
