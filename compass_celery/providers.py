"""Providers: what carries out a scaling decision (:mod:`compass_celery.planner.scaling`).

The rule says how many workers, which models a new one preloads and which one to
remove; a provider makes it so. The interface is three calls (:class:`Provider`):

- ``names()``: the workers it runs (starting or up), by Celery node name;
- ``add(preload)``: start one worker that loads ``preload`` before it takes any task
  (``compass_preload``: the worker loads them in its start, before it publishes its
  record and consumes), and return its name;
- ``remove(name)``: drain that worker with a warm shutdown (SIGTERM). Compass's
  hand-back re-places the tasks waiting in its queue and it finishes the one it runs,
  so nothing is lost and nothing runs twice.

:class:`LocalProvider` starts and stops worker processes on this machine (tests, the
demo, benchmarks). A Kubernetes provider is the KEDA ScaledObject on
``compass_workers_needed`` plus the hint in the new pod's worker arguments
(``--compass-preload``) and the chosen pod's ``controller.kubernetes.io/pod-deletion-cost``
lowered before the scale-in (not built yet); any other provider implements the same
three calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .local import WorkerProcess


class Provider(Protocol):
    """Starts and drains workers for an autoscaler (see the module)."""

    def names(self) -> list[str]:
        """The workers this provider runs, starting or up."""
        ...

    def add(self, preload: Sequence[str] = ()) -> str:
        """Start one worker that loads ``preload`` before its first task; its name."""
        ...

    def remove(self, name: str) -> None:
        """Drain ``name``: a warm shutdown that hands its waiting tasks back."""
        ...


class LocalProvider:
    """Worker processes on this machine (``celery -A app worker``, solo pool), each in its
    own process group; :meth:`close` (or leaving the ``with``) stops every one left."""

    def __init__(self, app: str, *, args: Sequence[str] = (),
                 env: dict[str, str] | None = None, prefix: str = "auto",
                 host: str = "local", stop_timeout_s: float = 60.0) -> None:
        self.app, self.args, self.env = app, list(args), dict(env or {})
        self.prefix, self.host, self.stop_timeout_s = prefix, host, stop_timeout_s
        self._procs: dict[str, WorkerProcess] = {}
        self._made = 0

    def names(self) -> list[str]:
        """The workers started and not removed (a process that died stays listed until
        removed: the watchdog drains its queue, the autoscaler decides on a new one)."""
        return list(self._procs)

    def add(self, preload: Sequence[str] = ()) -> str:
        """Start a worker with ``--compass-preload`` set to ``preload``; its node name."""
        self._made += 1
        name = f"{self.prefix}{self._made}@{self.host}"
        args = [*self.args]
        if preload:
            args += ["--compass-preload", ",".join(preload)]
        self._procs[name] = WorkerProcess(self.app, name, args, env=self.env).start()
        return name

    def remove(self, name: str) -> None:
        """SIGTERM ``name``'s process group and wait for it to exit (SIGKILL after
        ``stop_timeout_s``, when the task it runs outlasts that)."""
        proc = self._procs.pop(name)
        proc.stop(self.stop_timeout_s)

    def process(self, name: str) -> WorkerProcess:
        """The process behind ``name`` (its log, whether it is alive)."""
        return self._procs[name]

    def close(self) -> None:
        """Stop every worker still running."""
        for name in list(self._procs):
            self.remove(name)

    def __enter__(self) -> LocalProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
