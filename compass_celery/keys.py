"""Every Redis key compass owns, named once (rq's habit).

``{p}`` is ``compass_key_prefix``: two apps with different prefixes share
nothing. They live in the state Redis (``compass_redis_url``, by default the
broker's).
"""

from __future__ import annotations

# -- cluster state (state Redis) ------------------------------------------------------
WORKERS = "{p}:workers"          # hash: worker name -> JSON record
BACKLOG = "{p}:backlog"          # hash: worker name -> ms queued and running
PENDING = "{p}:pending"          # hash: worker name -> ms planned but not yet sent
PROFILES = "{p}:profiles"        # hash: "task|model" -> {"exec_ms", "n"}

# -- recovery (state Redis) -------------------------------------------------------------
DEAD_QUEUES = "{p}:dead-queues"  # set: queues of workers found dead
DRAIN_LOCK = "{p}:drain:{name}"  # one drainer per dead worker

# -- jobs (state Redis) -------------------------------------------------------------------
JOB = "{p}:job:{id}"             # hash: state, plan, nodes, deadline ... (see jobs.JobKeys)


def key(template: str, prefix: str, **fields: str) -> str:
    """Fill a template: ``key(WORKERS, "compass")`` -> ``"compass:workers"``."""
    return template.format(p=prefix, **fields)
