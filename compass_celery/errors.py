"""Compass's exceptions: bad input on one side, job outcomes on the other.

Input errors:

A malformed DAG, a workload file, a setting, a malformed task declaration or call
option, an unknown model, a model larger than every GPU, a task that cannot be
placed and a garbled worker record all raise a subclass of :class:`CompassInputError`, whose
message names the bad field; callers can catch them together (and still as
``ValueError``, which they all were before).
"""

from __future__ import annotations

from typing import Any


class CompassInputError(ValueError):
    """Bad input to compass; the message names what and where."""


class SetupError(CompassInputError):
    """Compass was installed in a way it cannot work with; the message says what to do."""


class SendFailed(ConnectionError):
    """A task was not sent: the broker or the result store could not be reached. Nothing
    was queued, so sending it again later cannot run it twice."""


class JobError(RuntimeError):
    """Base of job outcomes that are not a result."""


class JobFailed(JobError):
    """A node failed after its retries; names the node, task, worker and exception."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info if isinstance(info, dict) else {"exc": str(info)}
        super().__init__(self.info)  # its args rebuild it: pickle, Celery's result store

    def __str__(self) -> str:
        info = self.info
        if info.get("job") is None and info.get("task_id"):  # a plain task's
            return (f"task {info.get('task')}[{info.get('task_id')}] failed (worker "
                    f"{info.get('worker')}): {info.get('exc_type')}: {info.get('exc')}")
        return (f"job {info.get('job')} failed at node {info.get('node')!r} "
                f"(task {info.get('task')}, worker {info.get('worker')}): "
                f"{info.get('exc_type')}: {info.get('exc')}")


class Rejected(JobError):
    """Admission refused a job (or task) before anything was written or sent: the plan
    says it would miss its deadline, or every queue holds more work than the bound.
    ``retry_after_s`` says when the capacity it lacks frees up (HTTP ``Retry-After``);
    ``cause`` why it was refused, as refusals are counted (``deadline``, ``queue_full``,
    ``cold``: ``planner.admission.REFUSAL_CAUSES``)."""

    def __init__(self, what: str, reason: str, *, retry_after_s: float = 0.0,
                 predicted_ms: float | None = None, deadline_ms: float | None = None,
                 miss_ms: float = 0.0, slo: str = "", cause: str = "") -> None:
        self.what, self.reason, self.retry_after_s = what, reason, retry_after_s
        self.cause = cause
        self.predicted_ms, self.deadline_ms, self.miss_ms, self.slo = (
            predicted_ms, deadline_ms, miss_ms, slo)
        cls = f" (SLO class {slo!r})" if slo else ""
        super().__init__(f"{what} rejected{cls}: {reason}; capacity frees up in about "
                         f"{retry_after_s:.2f} s, retry after that")

    @property
    def retry_after(self) -> int:
        """Whole seconds for an HTTP ``Retry-After`` header (at least 1)."""
        return max(1, int(-(-self.retry_after_s // 1)))


class JobTimeout(JobError, TimeoutError):
    """The job did not finish in time."""


class DeadlineMissed(JobFailed):
    """A job was dropped (shed) before its next node ran, or a plain task before it
    started: starting it then could no longer meet the deadline. Nothing more was spent
    on it. A plain task's ``result.get()`` raises it too (its state stays ``REVOKED``)."""

    @classmethod
    def of_task(cls, task: str | None, task_id: str, worker: str | None) -> DeadlineMissed:
        """The error a plain task dropped unrun for its deadline ends with."""
        return cls({"job": None, "node": None, "task": task, "task_id": task_id,
                    "worker": worker, "exc_type": cls.__name__, "why": "deadline",
                    "exc": "shed before it started: starting it then could no longer "
                           "meet its deadline"})


class RetriesExhausted(JobError):
    """Redis stayed unavailable for longer than a step may wait for it."""
