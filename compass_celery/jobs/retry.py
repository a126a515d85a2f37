"""One retry policy for Redis hiccups (a restart, a pause, a failover, AOF loading).

Submissions, worker completions and the worker's own bookkeeping all retry
through :class:`RetryPolicy` (:func:`retry_transient` for one call), so every caller
backs off the same way and gives up with the same error. The delays are redis-py's
:class:`~redis.backoff.EqualJitterBackoff`: exponential, capped, and jittered, so
workers that lost Redis together (a failover) do not all come back in lockstep.

An error that says the request itself is wrong (a wrong password, an ACL denial, a
script or command error) is not retried: it would fail the same way until the give-up
time, and the caller should hear of it at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import redis
from kombu.exceptions import OperationalError
from redis.backoff import AbstractBackoff, EqualJitterBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from ..errors import RetriesExhausted
from ..state.connection import StateUnavailable

logger = logging.getLogger("compass_celery.jobs")

#: The errors that mean "Redis is briefly away", not "the request is wrong".
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, OSError, OperationalError,
             StateUnavailable)

#: Redis refused the client itself (a wrong password, an ACL without the command):
#: every retry is refused the same way.
REFUSED = (AuthenticationError, AuthorizationError, NoPermissionError,
           AuthenticationWrongNumberOfArgsError)

#: Error replies that say Redis is busy, full or between roles (a script running, memory
#: at maxmemory until keys expire, a replica not yet promoted, a cluster re-forming): a
#: retry can outlive them. Every other error reply is the request's own fault.
TRANSIENT_REPLIES = (ReadOnlyError, TryAgainError, ClusterDownError, OutOfMemoryError)
TRANSIENT_PREFIXES = ("BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY",
                      "NOREPLICAS", "OOM")


class _NotDone:
    """The type of :data:`NOT_DONE`."""

    def __repr__(self) -> str:
        return "NOT_DONE"


#: What a ``done`` check returns when the step did not take effect (so it runs again).
NOT_DONE: Final = _NotDone()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it wraps (kombu's and StateUnavailable keep Redis's as cause)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def refusal(exc: BaseException) -> BaseException | None:
    """The error by which Redis refused the client itself (authentication, ACL), ``exc``
    or one it wraps; None when it is something else."""
    return next((e for e in _chain(exc) if isinstance(e, REFUSED)), None)


def permanent(exc: BaseException) -> bool:
    """Whether ``exc`` says the request is wrong rather than Redis briefly away: a
    refused client, or an error reply other than a busy/full/failover one. Retrying
    it only delays the same error until the give-up time."""
    if refusal(exc) is not None:
        return True
    for e in _chain(exc):
        if isinstance(e, ResponseError) and not isinstance(e, TRANSIENT_REPLIES) \
                and not str(e).startswith(TRANSIENT_PREFIXES):
            return True
    return False


def done_if(check: Callable[[], bool], result: Any = None) -> Callable[[], Any]:
    """A ``done`` check from a yes/no ``check``: ``result`` (what the step returns) when it
    took effect, else :data:`NOT_DONE`. For steps whose result carries nothing."""
    return lambda: result if check() else NOT_DONE


@dataclass(frozen=True)
class RetryPolicy:
    """How a Redis step is retried: jittered exponential delays from ``delay_s`` up to
    ``max_delay_s``, on ``errors`` that are not :func:`permanent`, for up to ``give_up_s``
    in all. One place, so every caller backs off (and gives up) the same way."""

    give_up_s: float
    delay_s: float = 0.1
    max_delay_s: float = 1.0
    errors: tuple[type[BaseException], ...] = TRANSIENT

    def backoff(self) -> AbstractBackoff:
        """redis-py's equal-jitter backoff: the n-th delay (from 0) lies in [d/2, d] for
        d = min(max_delay_s, delay_s * 2**n), so callers spread out but never hammer."""
        return EqualJitterBackoff(cap=self.max_delay_s, base=self.delay_s)

    def delays(self) -> Iterator[float]:
        """The delays between tries, one per failure, without end."""
        backoff = self.backoff()
        backoff.reset()
        failures = 0
        while True:
            yield backoff.compute(failures)
            failures += 1

    def retries(self, exc: BaseException) -> bool:
        """Whether a step that raised ``exc`` is tried again."""
        return isinstance(exc, self.errors) and not permanent(exc)

    def run(self, what: str, step: Callable[[], Any],
            done: Callable[[], Any] | None = None) -> Any:
        """``step()``'s result, retrying Redis hiccups until ``give_up_s`` has passed, then
        :class:`RetriesExhausted`; an error not retried is raised as it is.

        ``done``, asked after a failure, returns the step's result when the step took
        effect although its reply was lost (e.g. read back from Redis), else
        :data:`NOT_DONE`: the caller gets the result either way and nothing is written
        or published twice."""
        give_up = time.monotonic() + self.give_up_s
        delays = self.delays()
        while True:
            try:
                return step()
            except BaseException as exc:
                if not self.retries(exc):
                    raise
                if done is not None:
                    result = self._done(what, done)
                    if result is not NOT_DONE:
                        return result
                left = give_up - time.monotonic()
                if left <= 0:
                    raise RetriesExhausted(f"{what}: Redis unavailable for "
                                           f"{self.give_up_s:g}s ({exc})") from exc
                delay = min(next(delays), left)
                logger.warning("compass: %s failed (%s); retrying in %.2fs", what, exc, delay)
                time.sleep(delay)

    def _done(self, what: str, done: Callable[[], Any]) -> Any:
        """``done()``, or :data:`NOT_DONE` when Redis is still away for it too."""
        try:
            result = done()
        except BaseException as exc:
            if not self.retries(exc):
                raise
            return NOT_DONE
        if isinstance(result, bool):  # the old yes/no contract would pass for a result
            raise TypeError(f"{what}: done() returned {result!r}; it returns the step's "
                            "result or NOT_DONE (done_if wraps a yes/no check)")
        return result


def retry_transient(what: str, step: Callable[[], Any], *, give_up_s: float,
                    done: Callable[[], Any] | None = None,
                    errors: tuple[type[BaseException], ...] = TRANSIENT,
                    delay_s: float = 0.1, max_delay_s: float = 1.0) -> Any:
    """``step()``'s result, retried through Redis hiccups by a :class:`RetryPolicy` of
    these settings (see :meth:`RetryPolicy.run`; ``done`` returns the step's result or
    :data:`NOT_DONE`)."""
    return RetryPolicy(give_up_s, delay_s, max_delay_s, errors).run(what, step, done)
