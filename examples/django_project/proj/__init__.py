"""The example Django project. Importing it loads the Celery app, so that
``shared_task`` binds to it (as in Celery's Django guide)."""

from .celery import app as celery_app

__all__ = ("celery_app",)
