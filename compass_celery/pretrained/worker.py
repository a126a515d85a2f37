"""The pretrained-model worker app for ``celery -A compass_celery.pretrained.worker``.

Settings come from ``COMPASS_*`` environment variables (see
:func:`~compass_celery.pretrained.app.make_app`). The app is built the first time
``app`` is asked for (as ``celery -A`` does), never merely by importing the module.
"""

from __future__ import annotations

from ..emulated import lazy_app
from .app import make_app

__getattr__ = lazy_app(__name__, make_app)
