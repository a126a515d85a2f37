"""Every Redis key compass owns, named once (rq's habit).

``{p}`` is ``compass_key_prefix``: two apps with different prefixes share
nothing. Keys about broker messages (staging, dead letters, leases) live in the
broker's Redis beside kombu's own keys (whose names kombu's settings give:
:class:`compass_celery.broker.kombu_redis.RedisLayout`), or in the state Redis over
RabbitMQ; the rest live in the state Redis (``compass_redis_url``, by default the
broker's), which may be a Redis Cluster. The benchmark's ledger lives in a Redis of
its own. Every template below says its Redis type, what it holds and who writes it;
code builds keys only from these templates (:func:`key`, or
:class:`compass_celery.jobs.keys.JobKeys` for one job's keys).

Hash tags keep every multi-key step in one cluster slot: the cluster state and
recovery's keys carry the prefix as their tag (``{compass}:workers``), so the
state scripts touch one slot; each job's keys carry its id (``compass:job:{id}``,
``compass:job:{id}:out`` ...), so jobs spread over the cluster and complete.lua
and fail.lua touch one slot each. On a single Redis the braces are just characters.
"""

from __future__ import annotations

# Each template: its Redis type, what it holds, and the module that writes it.

# -- cluster state (state Redis) ------------------------------------------------------
# hash: worker name -> JSON record (what planning reads); publish.lua / remove.lua, run by
# state/store.py (RedisStateStore.publish / remove)
WORKERS = "{{{p}}}:workers"
# hash: worker name -> JSON informational counters (pid, cache hits...), never read by
# planning; publish.lua / remove.lua, run by state/store.py
WORKER_STATS = "{{{p}}}:worker-stats"
# zset: worker name -> Redis TIME of its last publish (liveness); publish.lua / remove.lua,
# run by state/store.py
BEATS = "{{{p}}}:beats"
# hash: worker name -> its total backlog, ms queued and running; counters.lua, run by
# state/store.py (charge, set_backlog), and once.lua, run by jobs/submit.py (a job's
# sources). Its members are worker names and nothing else
BACKLOG = "{{{p}}}:backlog"
# hash: queued_member(worker, level) -> ms queued on that worker at that priority level
# and not started yet: charged with the backlog, taken off when the task starts, set by
# the worker's reconcile; counters.lua (state/store.py) and once.lua (jobs/submit.py)
QUEUED = "{{{p}}}:queued"
# hash: forming_member(worker, batch key) -> how many inputs of a batched task wait there
# (added by whoever sends one, taken off when it starts, set by the worker's reconcile):
# the planner reads the batch forming there from them; counters.lua and once.lua, as above
FORMING = "{{{p}}}:forming"
#: Separates the worker's name from the level or batch key in a QUEUED or FORMING member.
MEMBER_SEP = "\x1f"
# hash: worker name -> ms planned but not yet sent; counters.lua, run by state/store.py
# (add_pending), and once.lua, run by jobs/submit.py (a job's planned nodes)
PENDING = "{{{p}}}:pending"
# hash: queued_member(worker, level) -> the part of PENDING planned at that priority level:
# added and taken off with it, so a task of priority p counts only the planned work at p
# or above (planner.priority.for_priority); once.lua, counters.lua, as above
PENDING_QUEUED = "{{{p}}}:pending-queued"

# zset: loads_member(worker, model) -> when a load of that model there, planned by a
# producer and not yet under way, is to end (unix s, the producer's clock): every
# producer's planned loads, so the others plan around them until the worker's record
# shows the load (ZADD by state/store.py, plan_loads, from the router's and a job
# submission's flushes; read by snapshot.lua, entries past their end left out)
PLANNED_LOADS = "{{{p}}}:planned-loads"
#: What a producer's unwritten charges call a planned load not published yet
#: (``ChargeBatcher.read_through``: its member :func:`loads_member`, its amount the end).
LOADS = "loads"

#: The per-worker counter hashes by the name stores and the ledger call them: each one's
#: template and the letter its changes carry in the change log (CHANGES).
COUNTERS: dict[str, tuple[str, str]] = {
    "backlog": (BACKLOG, "b"), "queued": (QUEUED, "q"), "forming": (FORMING, "i"),
    "pending": (PENDING, "p"), "pending_queued": (PENDING_QUEUED, "r")}
# hash: "task|model" -> JSON {"exec_ms", "n"} learned run time; learn.lua, run by
# state/store.py (record_run)
PROFILES = "{{{p}}}:profiles"
# hash: SLO class -> JSON {"error_ms", "n"}: the learned quantile of how late its jobs end
# against their plan (admission's margin); learn.lua, run by state/store.py
# (record_plan_error)
PLAN_ERRORS = "{{{p}}}:plan-errors"
# hash: refusal_member(SLO class, cause) -> jobs and tasks admission refused for that
# cause (deadline, queue_full, cold); HINCRBY, run by state/store.py (count_refusal) for
# admission.py, read by ``compass status``
REFUSALS = "{{{p}}}:refusals"
# hash: version (bumped per change), epoch, floor (newest version trimmed); changelog.lua,
# put in front of every state script above (state/store.py, jobs/submit.py)
STATE_LOG = "{{{p}}}:state-log"
# zset: "w:"/"b:"/"q:"/"i:"/"p:"/"f:"/"e:" + name -> version of its last change;
# changelog.lua, as above
CHANGES = "{{{p}}}:changes"

# -- recovery (state Redis) -------------------------------------------------------------
# zset: queue of a stopped/dead worker -> Redis TIME it was marked; worker/recovery.py
DEAD_QUEUES = "{{{p}}}:dead-queues"
# string with PX: the one worker recovering this tick; worker/recovery.py
RECOVERY_LEADER = "{{{p}}}:recovery-leader"
# list: preload hints (comma-joined model names) an autoscaler published for the workers it
# asks for; a worker started with --compass-preload @hint pops one at start
# (state/hints.py: publish_hints, run by an autoscaler, writes; take_hint reads)
PRELOAD_HINTS = "{{{p}}}:preload-hints"
# hash with EX, one per wall-clock minute (``{minute}``: unix seconds // 60): field
# "<bucket>:<SLO class>" (bucket: unix seconds // the bucket width, 1 s) -> jobs submitted
# in that bucket, admitted or refused; HINCRBY by jobs/submit.py (in the step that records
# an admitted job, beside its deadline) and state/arrivals.py (a refused job), read by an
# autoscaler controller (state/arrivals.py: ArrivalCounter)
ARRIVALS = "{{{p}}}:arrivals:{minute}"

# -- broker messages (broker Redis; the state Redis over RabbitMQ) -----------------------
# list: messages taken from a queue, not yet re-placed; stage.lua / move.lua, run by
# broker/kombu_redis.py (RedisQueues)
STAGING = "{p}:staging:{queue}"
# list: JSON {queue, reason, raw} of unusable messages; move.lua and LPUSH by
# broker/kombu_redis.py (RedisQueues), LPUSH by broker/amqp.py (AmqpQueues, state Redis)
DEAD_LETTER = "{p}:dead-letter"
# zset: delivery tag -> Redis TIME its runner last renewed; lease.lua / stage.lua, run by
# broker/kombu_redis.py (RedisQueues)
LEASES = "{p}:leases"
# string with PX: when (Redis TIME, s) a worker began holding its slot for a planned
# successor (worker.core.slot_held_until: the bound counts from it); fetch.lua, run by
# broker/fetch.py, deletes it when the worker takes a message or stops holding
HELD_SLOT = "{p}:held-slot:{queue}"
# string with EX: one moved message copy's mark, "moving" before the publish, "moved"
# after the broker's confirm; SET by broker/amqp.py (AmqpQueues, in the state Redis)
AMQP_MOVE = "{p}:amqp-move:{id}"

# -- jobs (state Redis): one job's keys share its id as hash tag; jobs/keys.py's JobKeys
# fills them, complete.lua expects them in this order ------------------------------------
# hash: state, plan, names, deadline, "n:<node>" spec (a source's without its input, which
# only its message carries) and "p:<node>" plan ...; HSET by
# jobs/submit.py, state changed by complete.lua (jobs/runtime.py) and fail.lua
# (jobs/failure.py)
JOB = "{p}:job:{{{id}}}"
# hash: node -> its output JSON; complete.lua, run by jobs/runtime.py
JOB_OUTPUTS = "{p}:job:{{{id}}}:out"
# hash: node -> predecessors not yet complete; HSET by jobs/submit.py, decremented by
# complete.lua (jobs/runtime.py)
JOB_LEFT = "{p}:job:{{{id}}}:left"
# list: "SUCCESS" or "FAILURE", pushed when the job ends (waiters block on it with
# BLMOVE); complete.lua (jobs/runtime.py), fail.lua (jobs/failure.py)
JOB_DONE = "{p}:job:{{{id}}}:done"
# hash: node -> JSON run info (worker, task id, timing); complete.lua, run by
# jobs/runtime.py
JOB_INFO = "{p}:job:{{{id}}}:info"
# hash: node -> task id sent ("?<id>" while claimed, not yet confirmed); HSET by
# jobs/submit.py (sources) and jobs/runtime.py (successors), claimed by complete.lua
JOB_TASKS = "{p}:job:{{{id}}}:tasks"
# zset: running job id -> deadline (unix s); ZADD by jobs/submit.py, swept (ZREM) by
# jobs/failure.py
JOB_DEADLINES = "{{{p}}}:jobs:deadlines"
# string with EX: a submission's counter change, applied once; once.lua, run by
# jobs/submit.py
ONCE = "{{{p}}}:once:{token}"

# -- benchmark ledger (the private Redis named by COMPASS_BENCH_LEDGER_URL) ---------------
# hash: task id -> executions begun (a killed worker's half-run task too); HINCRBY by
# emulated.py, read and deleted by bench/runner.py
BENCH_STARTS = "{p}:bench:starts"
# hash: task id -> executions that ran to the end; HINCRBY by emulated.py, read and
# deleted by bench/runner.py
BENCH_EXECS = "{p}:bench:execs"


def key(template: str, prefix: str, **fields: str) -> str:
    """Fill a template: ``key(WORKERS, "compass")`` -> ``"{compass}:workers"``."""
    return template.format(p=prefix, **fields)


def queued_member(worker: str, level: int) -> str:
    """The QUEUED member holding ``worker``'s queued work at priority ``level``."""
    return f"{worker}{MEMBER_SEP}{int(level)}"


def forming_member(worker: str, batch: str) -> str:
    """The FORMING member counting the inputs of batch key ``batch`` waiting on ``worker``."""
    return f"{worker}{MEMBER_SEP}{batch}"


def loads_member(worker: str, model: str) -> str:
    """The PLANNED_LOADS member of a planned load of ``model`` on ``worker``."""
    return f"{worker}{MEMBER_SEP}{model}"


def refusal_member(slo: str, cause: str) -> str:
    """The REFUSALS member counting SLO class ``slo``'s refusals for ``cause``."""
    return f"{slo}{MEMBER_SEP}{cause}"


def split_member(member: str) -> tuple[str, str]:
    """A QUEUED, FORMING or PLANNED_LOADS member as (worker, level, batch key or model)."""
    worker, _, part = member.partition(MEMBER_SEP)
    return worker, part

#: The message header a job node carries: job id, node name, inputs, where it moved from
#: (here, below the broker, which reads whether a node is a job's later step).
JOB_HEADER = "compass_job"
