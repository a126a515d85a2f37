"""Compass jobs: a DAG of Celery tasks, submitted as one job and read through a handle.

This is the face users import from (``from compass_celery.jobs import Dag, JobHandle``);
the modules behind it: building (``dag``, ``canvas``; the pure checks live in
``compass_celery.dag_validation``, shared with the workload parser), submitting
(``submit``), completing on the worker (``runtime``), failing (``failure``), reading
(``handle``), eager runs (``eager``), the Redis layout of a job (``keys``) and the
Lua scripts beside them.
"""

from __future__ import annotations

from ..dag_validation import DagValidationError
from ..errors import JobError, JobFailed, JobTimeout, RetriesExhausted
from .dag import Dag
from .handle import JobHandle

__all__ = ["Dag", "DagValidationError", "JobError", "JobFailed", "JobHandle", "JobTimeout",
           "RetriesExhausted"]
