"""The Task base class ``Compass(app)`` installs on an app (``app.Task``): it places tasks
run eagerly, turns a send that cannot reach the broker or result store into
:class:`~compass_celery.errors.SendFailed`, and is the worker's entry point for a batched
task (``compass_batch``: every waiting input run as one call).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery, states
from celery.worker.request import Request
from kombu.exceptions import OperationalError
from kombu.utils.imports import symbol_by_name
from redis.exceptions import ConnectionError as RedisConnectionError

from . import ledger
from .admission import shed_for_deadline, task_call
from .eager import place_eagerly
from .errors import DeadlineMissed, SendFailed, SetupError
from .jobs.limits import check_task_input
from .needs import batch_options, check_batched_call, declared
from .placement import Decision
from .state.urls import masked

#: What a send raises when it cannot reach the broker (kombu) or the result store (redis-py).
UNREACHABLE: tuple[type[BaseException], ...] = (OperationalError, RedisConnectionError)


def unreachable(exc: BaseException) -> BaseException | None:
    """The connection error that stopped a send: ``exc`` itself, or the one a RuntimeError
    was raised from (Celery's Redis result store raises one when it gives up
    reconnecting); None when ``exc`` is no failure to reach the broker or result store."""
    if isinstance(exc, UNREACHABLE):
        return exc.__cause__ or exc
    if isinstance(exc, RuntimeError) and isinstance(exc.__cause__, UNREACHABLE):
        return exc.__cause__
    return None


class CompassRequest(Request):
    """The worker's request for a compass app's task: one Celery drops unrun past the
    latest start that could meet its deadline ends with
    :class:`~compass_celery.errors.DeadlineMissed` in the result store (state
    ``REVOKED``, as Celery's own), so ``result.get()`` raises what a Dag's handle raises,
    not Celery's ``TaskRevokedError('expired')``."""

    _compass_shed = False

    def revoked(self) -> bool:
        """Celery's check; when it drops the task for its deadline, the result stored is
        DeadlineMissed (stored first, so no reader ever sees Celery's in its place)."""
        if not self._already_revoked and self.expires and shed_for_deadline(
                Decision.from_header(self.request_dict.get("compass")), time.time()):
            if super().store_errors:
                self.task.backend.store_result(
                    self.id, DeadlineMissed.of_task(self.name, self.id, self.hostname),
                    states.REVOKED, request=self._context)
            self._compass_shed = True
        return super().revoked()

    @property
    def store_errors(self) -> bool:
        """Celery's, except for a task shed for its deadline: its DeadlineMissed is stored
        already, and Celery's ``TaskRevokedError`` must not be stored over it."""
        return not self._compass_shed and super().store_errors


class CompassTaskMixin:
    """Mixed into ``app.Task`` by ``Compass(app)``: places tasks run eagerly, turns an
    unreachable broker or result store at send into one :class:`SendFailed`, and runs a
    batched task (``compass_batch``) over every input waiting for it on its worker."""

    #: A worker's request for it (:class:`CompassRequest`).
    Request = f"{__name__}:CompassRequest"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body; a batched task's body gets a list of inputs (a batch of one in
        eager mode), and this call returns its own input's result."""
        opts = batch_options(self)
        if opts is None:
            return super().__call__(*args, **kwargs)  # type: ignore[misc]
        check_batched_call(self, args, kwargs)
        from .worker.batch import call_batched, current_batcher

        runner = current_batcher()
        request = getattr(self, "request", None)
        if runner is None or request is None or getattr(request, "is_eager", False):
            ok, result = call_batched(self, [args[0]])[0]
            if not ok:
                raise result
            return result
        return runner.run(self, opts, args[0])

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send as Celery does, taking a Dag's keywords too (``slo=``, ``deadline_ms=``,
        ``on_miss=``, and ``priority=`` as a level 0..9 or a class name: see
        :func:`~compass_celery.admission.task_call`); a broker or result store that cannot
        be reached raises one :class:`SendFailed` naming it (password masked) and the cause."""
        check_batched_call(self, args, kwargs)
        compass = getattr(self.app, "compass", None)  # type: ignore[attr-defined]
        if compass is not None:
            options = task_call(compass, self, options)
            check_task_input(compass.settings, self, args, kwargs, options)
        try:
            return super().apply_async(args, kwargs, **options)  # type: ignore[misc]
        except (*UNREACHABLE, RuntimeError) as exc:
            cause = unreachable(exc)
            if cause is None:
                raise
            conf = self.app.conf  # type: ignore[attr-defined]
            raise SendFailed(
                f"task {self.name!r} was not sent (nothing was queued): cannot reach the "  # type: ignore[attr-defined]
                f"broker at {masked(conf.broker_url)} or the result store at "
                f"{masked(conf.result_backend)}: {cause}") from exc

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Place the task against in-process state, then run it inline as Celery does."""
        compass = getattr(self.app, "compass", None)  # type: ignore[attr-defined]
        if compass is None or not compass.eager:
            return super().apply(args, kwargs, **options)  # type: ignore[misc]
        options = task_call(compass, self, options)
        compass.follow_mode(eager=True)
        decision = place_eagerly(compass, self, options)
        if decision is None:
            return super().apply(args, kwargs, **options)  # type: ignore[misc]
        headers = dict(options.pop("headers", None) or {})
        headers["compass"] = decision.as_header()
        try:
            result = super().apply(args, kwargs, headers=headers, **options)  # type: ignore[misc]
        finally:
            ledger.charge(compass, decision, -1)
        compass.remember(result.id, decision)
        return result


def refuse_bound_tasks(app: Celery) -> None:
    """Refuse ``Compass(app)`` on an app whose compass tasks are already bound: they were
    built from the plain ``app.Task``, so eager mode could not place them. Another compass
    app's tasks, which Celery binds into this one too (``shared`` tasks), are not named."""
    # the registry as it is now (app.tasks would finalize the app and bind the rest)
    bound = sorted(name for name, task in dict(app._tasks).items()
                   if not isinstance(task, CompassTaskMixin) and declared(task)
                   and not _another_apps(app, name, task))
    if bound:
        raise SetupError(
            f"Compass(app) must be called before the app's tasks are bound; these were "
            f"bound already: {', '.join(bound)}. Call Compass(app) right after creating the "
            f"app, before anything reads app.tasks or a task's attributes")


def _another_apps(app: Celery, name: str, task: Any) -> bool:
    """Whether ``task`` is another compass app's, bound here only as a Celery shared task:
    a live app other than ``app`` holds a compass task of that name on the same function."""
    from celery._state import _get_active_apps

    run = _function(task)
    for other in _get_active_apps():
        theirs = dict(other._tasks).get(name) if other is not app else None
        if isinstance(theirs, CompassTaskMixin) and _function(theirs) is run:
            return True
    return False


def _function(task: Any) -> Any:
    """The function a decorated task runs (its class's ``run``, unwrapped)."""
    run = type(task).__dict__.get("run")
    return getattr(run, "__func__", run)


def install_task_class(app: Celery) -> None:
    """Make ``app.Task`` place eagerly; call ``Compass(app)`` before defining tasks."""
    base = app.Task
    if issubclass(base, CompassTaskMixin):
        return
    attrs: dict[str, Any] = {"__module__": base.__module__}
    theirs = symbol_by_name(base.Request)
    if theirs is not Request:  # the app's own request class: compass's is mixed in
        attrs["Request"] = type(theirs.__name__, (CompassRequest, theirs),
                                {"__module__": theirs.__module__})
    app.Task = type(base.__name__, (CompassTaskMixin, base), attrs)
