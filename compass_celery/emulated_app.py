"""The emulated-GPU worker app, built at import for ``celery -A compass_celery.emulated_app``.

Settings come from ``COMPASS_*`` environment variables (see
:func:`~compass_celery.emulated.make_app`); the benchmark and the demo start their
workers from this module.
"""

from .emulated import make_app

app = make_app()
