"""The public names of compass jobs, gathered from the modules that implement them.

Submission lives in :mod:`~compass_celery.jobs.submit`, the worker side in
:mod:`~compass_celery.jobs.runtime`, failure in :mod:`~compass_celery.jobs.failure`,
the handle in :mod:`~compass_celery.jobs.handle` and the Redis layout of a job in
:mod:`~compass_celery.jobs.keys`. Nothing inside the package imports this module;
it is here so user code has one place to import job names from.
"""

from __future__ import annotations

from ..errors import JobError, JobFailed, JobTimeout, RetriesExhausted
from .failure import fail_job, sweep_overdue
from .handle import JobHandle
from .keys import INPUT_REF, JOB_HEADER, JobKeys, deadlines_key
from .retry import retry_transient
from .submit import publish_node, submit

__all__ = ["INPUT_REF", "JOB_HEADER", "JobError", "JobFailed", "JobHandle", "JobKeys",
           "JobTimeout", "RetriesExhausted", "deadlines_key", "fail_job", "publish_node",
           "retry_transient", "submit", "sweep_overdue"]
