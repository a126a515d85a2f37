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
