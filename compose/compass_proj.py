"""The Celery app the compose deployment runs out of the box.

It is the emulated-GPU app of ``compass_celery.emulated`` plus the monitoring hooks.
For real models, point ``COMPASS_APP`` at your own module and add the same
monitoring line after ``Compass(app)``.
"""

from compass_celery.emulated import make_app
from compass_celery.monitoring import serve_metrics_in_worker

# Task events feed Flower; sent events give Flower each task's routing key (its queue).
app = make_app(worker_send_task_events=True, task_send_sent_event=True)
serve_metrics_in_worker()      # Prometheus on $COMPASS_METRICS_PORT in each worker
