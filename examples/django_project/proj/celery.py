"""The project's Celery app, with Compass scheduling its per-worker queues.

Start a worker with an emulated GPU (no CUDA or torch needed)::

    celery -A proj worker -P solo -n gpu0@%h --compass-emulate-gpu-mb 4000
"""

import os

from celery import Celery

from compass_celery import Compass

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
# Every CELERY_* setting in proj/settings.py, CELERY_COMPASS_* included.
app.config_from_object("django.conf:settings", namespace="CELERY")
Compass(app)  # before the tasks are bound, so they get the Compass task class
app.autodiscover_tasks()
