"""Every Redis key compass owns, named once (rq's habit).

``{p}`` is ``compass_key_prefix``: two apps with different prefixes share
nothing. Keys about broker messages (staging, dead letters, leases) live in the
broker's Redis beside kombu's own keys; the rest live in the state Redis
(``compass_redis_url``, by default the broker's), which may be a Redis Cluster.

Hash tags keep every multi-key step in one cluster slot: the cluster state and
recovery's keys carry the prefix as their tag (``{compass}:workers``), so the
state scripts touch one slot; each job's keys carry its id (``compass:job:{id}``,
``compass:job:{id}:out`` ...), so jobs spread over the cluster and complete.lua
and fail.lua touch one slot each. On a single Redis the braces are just characters.
"""

from __future__ import annotations

# -- cluster state (state Redis) ------------------------------------------------------
WORKERS = "{{{p}}}:workers"          # hash: worker name -> JSON record (what planning reads)
WORKER_STATS = "{{{p}}}:worker-stats"  # hash: worker name -> JSON counters (pid, cache hits...)
BEATS = "{{{p}}}:beats"              # zset: worker name -> Redis TIME of its last publish
BACKLOG = "{{{p}}}:backlog"          # hash: worker name -> ms queued and running
PENDING = "{{{p}}}:pending"          # hash: worker name -> ms planned but not yet sent
PROFILES = "{{{p}}}:profiles"        # hash: "task|model" -> {"exec_ms", "n"}
STATE_LOG = "{{{p}}}:state-log"      # hash: version (bumped per change), epoch, floor (trimmed)
CHANGES = "{{{p}}}:changes"          # zset: "w:"/"b:"/"p:"/"f:" + name -> version of last change

# -- recovery (state Redis) -------------------------------------------------------------
DEAD_QUEUES = "{{{p}}}:dead-queues"  # zset: queue of a stopped/dead worker -> Redis TIME marked
RECOVERY_LEADER = "{{{p}}}:recovery-leader"  # string with PX: the one worker recovering this tick

# -- broker messages (broker Redis) -----------------------------------------------------
STAGING = "{p}:staging:{queue}"  # list: messages taken from a queue, not yet re-placed
DEAD_LETTER = "{p}:dead-letter"  # list: JSON {queue, reason, raw} of unusable messages
LEASES = "{p}:leases"            # zset: delivery tag -> Redis TIME its runner last renewed

# -- jobs (state Redis) -------------------------------------------------------------------
JOB = "{p}:job:{{{id}}}"         # hash: state, plan, nodes, deadline ... (see jobs.JobKeys)
JOB_DEADLINES = "{{{p}}}:jobs:deadlines"  # zset: running job id -> deadline (unix s)
ONCE = "{{{p}}}:once:{token}"    # string with EX: a submission's counter change, applied once


def key(template: str, prefix: str, **fields: str) -> str:
    """Fill a template: ``key(WORKERS, "compass")`` -> ``"{compass}:workers"``."""
    return template.format(p=prefix, **fields)
