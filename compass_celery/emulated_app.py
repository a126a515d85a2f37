"""The emulated-GPU worker app for ``celery -A compass_celery.emulated_app``.

Settings come from ``COMPASS_*`` environment variables (see
:func:`~compass_celery.emulated.make_app`); the benchmark and the demo start their
workers from this module. The app is built the first time ``app`` is asked for (as
``celery -A`` does), never merely by importing the module.
"""

from __future__ import annotations

from .emulated import lazy_app, make_app

__getattr__ = lazy_app(__name__, make_app)
