"""A failed task leaves no reference cycle behind: its exception is freed as soon as the
tracer lets go of it, not at the next full garbage collection (worker RSS crept up with
every failure while those cycles waited for one)."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Callable
from typing import Any

from celery import Celery, signals
from celery.app.trace import build_tracer

from compass_celery.worker.task_path import drop_traceback


class Boom(Exception):
    pass


def _failure_survives(hook: Callable[..., Any] | None) -> bool:
    """Trace one failing task as a worker does, with the cyclic collector off; whether its
    exception is still alive afterwards (kept only by a cycle)."""
    app = Celery("failing", set_as_current=False)
    made: list[weakref.ref[Boom]] = []

    @app.task(bind=True, shared=False)
    def fail(self: Any) -> None:
        exc = Boom("bad input")
        made.append(weakref.ref(exc))
        raise exc

    if hook is not None:
        signals.task_postrun.connect(hook, weak=False)
    tracer = build_tracer(fail.name, fail, eager=False, propagate=False, app=app)
    gc.collect()
    gc.disable()
    # a worker's log handlers format a failure and let it go; pytest's capture keeps the
    # record (and its exception), which would keep the failure alive here
    logging.disable(logging.CRITICAL)
    try:
        tracer("task-1", (), {}, {"id": "task-1"})
        return made[0]() is not None
    finally:
        logging.disable(logging.NOTSET)
        gc.enable()
        if hook is not None:
            signals.task_postrun.disconnect(hook)


def test_without_the_hook_a_failure_waits_for_the_garbage_collector():
    assert _failure_survives(None)  # the cycle the hook exists to break


def test_dropping_the_traceback_at_postrun_frees_the_failure_at_once():
    def hook(retval: Any = None, **kw: Any) -> None:
        drop_traceback(retval)

    assert not _failure_survives(hook)


def test_a_successful_result_is_left_alone():
    value = {"ok": 1}
    drop_traceback(value)
    assert value == {"ok": 1}
