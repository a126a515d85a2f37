"""Entry point for workers.

    celery -A make_celery worker -P solo -n gpu0@%h --compass-emulate-gpu-mb 4000

With ``FLASK_COMPASS_EXAMPLE_MODELS=real`` (the real pretrained models), on the CPU::

    celery -A make_celery worker -P solo -n cpu0@%h --compass-gpu cpu --compass-device-mb 200
"""

from vision_api import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
