"""A Flask app that captions and translates images through a Compass-planned job.

Celery is wired as in Flask's "Background Tasks with Celery" guide
(``celery_init_app``), with one more line: ``Compass(celery_app)``. With
``COMPASS_EXAMPLE_MODELS = "real"`` in the config (``FLASK_COMPASS_EXAMPLE_MODELS=real``)
it also runs real pretrained models and serves ``POST /search/``.
"""

from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from flask import Flask

from compass_celery import Compass

DEFAULT_CELERY: dict[str, Any] = {
    "broker_url": "redis://localhost:6379/0",  # the result backend follows it unless set
    # Compass: the model catalogue (name -> size in MB) and other compass_* settings.
    "compass_models": {"detector": 1200, "captioner": 950, "translator": 300},
    "compass_state_refresh_s": 0.1,
    "compass_job_timeout_s": 120.0,
}
#: ``app.config["COMPASS_EXAMPLE_MODELS"]``: "emulated" (the default: stand-in tasks, no
#: torch) or "real" (all-MiniLM-L6-v2 and Silero VAD, ``pip install -e '.[examples,real]'``).
EXAMPLE_MODELS = ("emulated", "real")


def example_models(app: Flask) -> str:
    """The app's ``COMPASS_EXAMPLE_MODELS``, checked."""
    value = app.config.get("COMPASS_EXAMPLE_MODELS", "emulated")
    if value not in EXAMPLE_MODELS:
        raise ValueError(f"COMPASS_EXAMPLE_MODELS is {value!r}: use "
                         f"{' or '.join(map(repr, EXAMPLE_MODELS))}")
    return value


def celery_init_app(app: Flask) -> Celery:
    """Create the Celery app from ``app.config["CELERY"]``; tasks run in the app context."""

    class FlaskTask(Task):
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    celery_app = Celery(app.name, task_cls=FlaskTask)
    conf = dict(app.config["CELERY"])
    conf.setdefault("result_backend", conf["broker_url"])  # one override moves both
    celery_app.config_from_object(conf)
    Compass(celery_app)  # before the shared tasks are bound to this app
    if example_models(app) == "real":
        from compass_celery.pretrained.app import add_pretrained

        add_pretrained(celery_app)  # all-MiniLM-L6-v2 and Silero VAD, with their tasks
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The application factory.

    ``config`` overrides the defaults (its ``CELERY`` entries are merged into the Celery
    defaults); then ``FLASK_*`` environment variables do, e.g.
    ``FLASK_CELERY__broker_url=redis://redis:6379/0`` or
    ``FLASK_COMPASS_EXAMPLE_MODELS=real``.
    """
    app = Flask(__name__)
    overrides = dict(config or {})
    celery = {**DEFAULT_CELERY, **overrides.pop("CELERY", {})}
    app.config.from_mapping({"COMPASS_EXAMPLE_MODELS": "emulated", **overrides},
                            CELERY=celery)
    app.config.from_prefixed_env()
    celery_init_app(app)

    from . import tasks  # noqa: F401 - registers the shared tasks
    from .views import bp

    app.register_blueprint(bp)
    return app
