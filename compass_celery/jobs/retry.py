"""One retry loop for Redis hiccups (a restart, a pause, a failover, AOF loading).

Submissions, worker completions and the worker's own bookkeeping all retry
through :func:`retry_transient`, so every caller backs off the same way and
gives up with the same error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu.exceptions import OperationalError

from ..errors import RetriesExhausted
from ..state.connection import StateUnavailable

logger = logging.getLogger("compass_celery.jobs")

#: The errors that mean "Redis is briefly away", not "the request is wrong".
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OSError, OperationalError,
             StateUnavailable)


def retry_transient(what: str, step: Callable[[], Any], *, give_up_s: float,
                    done: Callable[[], bool] | None = None,
                    errors: tuple[type[BaseException], ...] = TRANSIENT,
                    delay_s: float = 0.1, max_delay_s: float = 1.0) -> Any:
    """Run ``step``, retrying Redis hiccups (a restart, a pause, a failover, AOF loading)
    with a doubling delay for up to ``give_up_s``, then raise :class:`RetriesExhausted`.

    ``done`` tells whether a step whose reply was lost took effect anyway, so
    nothing is written or published twice. Submissions and worker completions both
    retry through here.
    """
    give_up = time.monotonic() + give_up_s
    delay = delay_s
    while True:
        try:
            return step()
        except errors as exc:
            if done is not None:
                try:
                    if done():
                        return True
                except errors:
                    pass
            if time.monotonic() > give_up:
                raise RetriesExhausted(f"{what}: Redis unavailable for {give_up_s:g}s "
                                       f"({exc})") from exc
            logger.warning("compass: %s failed (%s); retrying in %.1fs", what, exc, delay)
            time.sleep(delay)
            delay = min(max_delay_s, delay * 2)
