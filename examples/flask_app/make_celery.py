"""Entry point for workers.

    celery -A make_celery worker -P solo -n gpu0@%h --compass-emulate-gpu-mb 4000
"""

from vision_api import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
