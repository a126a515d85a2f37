"""Celery-style signals for Compass hooks; listeners never fail an enqueue or a task.

Prometheus metrics, the Flower formatter, the benchmark recorder and test
probes connect here; the planner and router never know who listens.
"""

from celery.utils.dispatch import Signal

#: A task was placed (router or eager). Provides ``decision``.
task_placed = Signal(name="compass_task_placed", providing_args={"decision"})
#: A successor was moved by the adjustment phase. Provides ``job_id``, ``node``, ``old``, ``new``.
task_reassigned = Signal(name="compass_task_reassigned",
                         providing_args={"job_id", "node", "old", "new"})
#: A model finished loading on a worker. Provides ``model``, ``size_mb``, ``ms``.
model_loaded = Signal(name="compass_model_loaded", providing_args={"model", "size_mb", "ms"})
#: A model left a worker's GPU memory. Provides ``model``.
model_evicted = Signal(name="compass_model_evicted", providing_args={"model"})
#: Admission judged a task or job (producer side). Provides ``what`` (its name), ``slo``
#: (an ``Slo`` or None) and ``verdict`` (admitted, late, predicted and deadline ms).
admission_decided = Signal(name="compass_admission_decided",
                           providing_args={"what", "slo", "verdict"})
#: A worker dropped a job or task that could no longer meet its deadline, before
#: running it. Provides ``job_id`` (None for a plain task), ``node``, ``task_id``, ``slo``.
task_shed = Signal(name="compass_task_shed",
                   providing_args={"job_id", "node", "task_id", "slo"})
#: A job with a deadline ended in success (on the worker that finished it). Provides
#: ``job_id``, ``slo``, ``met`` (finished by its deadline) and ``late_ms`` (how far past
#: it, workload ms; negative: early).
job_deadline_outcome = Signal(name="compass_job_deadline_outcome",
                              providing_args={"job_id", "slo", "met", "late_ms"})
