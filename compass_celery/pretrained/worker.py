"""The pretrained-model worker app for ``celery -A compass_celery.pretrained.worker``.

Settings come from ``COMPASS_*`` environment variables (see
:func:`~compass_celery.pretrained.app.make_app`). The app is built the first time
``app`` is asked for (as ``celery -A`` does), never merely by importing the module.
"""

from __future__ import annotations

import threading
from typing import Any

from .app import make_app

_built: dict[str, Any] = {}
_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        if "app" not in _built:
            _built["app"] = make_app()
        return _built["app"]
