"""The benchmark's options: which policies, how much load, which faults."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..planner import VARIANTS as _VARIANTS

#: Every policy, in the order the benchmark runs and reports them.
POLICIES = ["celery-default", "round-robin", "random", "jsq", "hash", "heft", "compass"]

#: Baselines the benchmark runs under a planner policy of another name: what a Celery user
#: would set up today (``planner.VARIANTS``, which the simulator runs too).
VARIANTS = _VARIANTS


def planner_policy(policy: str) -> str:
    """The planner policy a benchmark policy (or variant) runs under."""
    return VARIANTS.get(policy, policy)


@dataclass
class BenchOptions:
    """One benchmark run's settings (the ``bench`` command's flags)."""

    policies: Sequence[str] = tuple(POLICIES)
    rate: float | None = None
    jobs: int | None = None
    time_scale: float = 0.5
    warmup_frac: float = 0.1
    redis_url: str | None = None
    # The workers' broker; None = the Redis above. An amqp:// URL puts the task messages in
    # RabbitMQ and keeps compass's state (and the results) in that Redis.
    broker_url: str | None = None
    workers: int | None = None
    kill_worker_after: float | None = None
    kill_restarts: int | None = None          # SIGKILL + same-name restart, this many times
    restart_redis_after: float | None = None
    # Faults, all in real seconds; None = off. See the ``bench`` command's --help.
    rolling_restart_after: float | None = None
    pause_redis_after: float | None = None
    pause_redis_for: float | None = None      # None = 2x heartbeat_timeout_s
    skew_clock_s: float | None = None         # one worker's wall clock this far ahead
    long_task_s: float | None = None          # one extra job of one task this long
    redis_aof: bool = False                   # the private Redis appends to an AOF
    drain_timeout_s: float = 90.0
    # Redis transport visibility timeout for the workers (real s): how soon plain Celery
    # redelivers a dead worker's unacked task; the same for every policy. With
    # long_task_s it is lowered to half the long task, so that task outlives it.
    visibility_timeout_s: float = 60.0
    # Workers' heartbeat timeout (real s): short, so that faults resolve in seconds.
    heartbeat_timeout_s: float = 3.0
    # After the last job ended, wait this long for acks before counting stranded messages.
    settle_s: float = 1.0
    # Workers' eviction policy; None = LRU for celery-default (plain Celery), else lookahead.
    cache_policy: str | None = None
    # Real models (compass_celery.pretrained) instead of emulated GPUs, on this device.
    # Admission at submission (compass_admission): off, a job predicted to miss its
    # deadline is taken and marked late (and still shed once it falls behind).
    admission: bool = True
    # compass_admission_headroom (share of a deadline kept for the plan's error); None =
    # the app's default.
    headroom: float | None = None
    # Batched tasks (a workload node's ``batch``): whether workers batch
    # (compass_batching; off: each input runs as a batch of one), and whether placement
    # counts the batches forming in queues (compass_batch_aware; off: blind).
    batching: bool = True
    batch_aware: bool = True
    real: bool = False
    device: str = "cpu"
    progress: bool = True
    log_dir: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
