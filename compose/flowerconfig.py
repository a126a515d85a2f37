# Flower configuration for compass-celery (Flower executes this file as Python).
#
#   celery -A proj flower --conf=compose/flowerconfig.py
#
# Flower sets every top-level name that matches one of its options and ignores
# the rest, so helper names start with an underscore.
#
# What this adds to Flower:
# * /metrics (Flower serves the default Prometheus registry there) gains the
#   compass_worker_* / compass_state_up gauges, read from the Compass state in
#   Redis at each scrape.
# * Nothing is needed for placement: each task's "where and why" rides on its
#   kwargs (the message's kwargsrepr), so the task list, task page and REST API
#   show it as they show kwargs.
#
# The signal counters (compass_tasks_placed_total, compass_model_loads_total, ...)
# are not here: Celery signals fire in the process that places or loads, never in
# Flower. Scrape them from the workers and producers (serve_metrics).
import os as _os

from celery import current_app as _current_app

from compass_celery.monitoring import register_app_state_collector as _register_app
from compass_celery.monitoring import register_state_collector as _register

# `celery -A proj flower --conf=...` loads the app first: its compass settings win.
if not _register_app(_current_app._get_current_object()):
    _register(
        _os.environ.get("COMPASS_REDIS_URL") or _os.environ.get("CELERY_BROKER_URL")
        or _os.environ.get("COMPASS_BROKER_URL") or "redis://127.0.0.1:6379/0",
        prefix=_os.environ.get("COMPASS_KEY_PREFIX", "compass"),
        heartbeat_timeout_s=float(_os.environ.get("COMPASS_HEARTBEAT_TIMEOUT_S", "5")),
    )

# Show args (the short placement in front), the routing key and kwargs in the task list.
tasks_columns = "name,uuid,state,args,routing_key,worker,received,runtime,kwargs"
