"""torch's CPU threads on a worker whose device is ``cpu``: its share of the host's cores.

torch starts with one intra-op thread per core in every process, so two CPU workers on a
two-core host each run two threads on the same two cores and slow each other down.
A CPU worker takes instead ``cores // sharers`` threads (at least one), where the sharers
are the live CPU workers on this host (the records in the state store whose name ends
in this worker's ``@host``) times the processes each runs tasks in (``concurrency``).
``compass_torch_threads`` (or ``--compass-torch-threads``) sets the number outright, and
an ``OMP_NUM_THREADS`` the user exported is left as it is.

A thread count is per thread in torch (OpenMP), so it is applied in the thread that runs
tasks: at start, before the preload, and again before a task when the count changed (a
worker on the same host started or stopped).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

logger = logging.getLogger("compass_celery.worker")


def host_of(name: str) -> str:
    """The host part of a worker's node name (``cpu0@box`` -> ``box``; no ``@``: '')."""
    return name.rpartition("@")[2] if "@" in name else ""


def cores() -> int:
    """The cores this process may run on (its CPU affinity, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def share(n_cores: int, cpu_workers: int, concurrency: int) -> int:
    """One worker process's threads: the cores over the processes sharing them, at least 1."""
    return max(1, n_cores // max(1, cpu_workers * max(1, concurrency)))


def cpu_workers_on(host: str, me: str, workers: Iterable[Any]) -> int:
    """How many live CPU workers (``device == 'cpu'``) run on ``host``, this one counted
    even before its own record is published."""
    names = {w.name for w in workers if w.device == "cpu" and host_of(w.name) == host}
    return len(names | {me})


class CpuThreads:
    """What torch's thread count should be on this worker, kept up to date from the
    records of the workers beside it, and applied in the thread that runs tasks."""

    def __init__(self, name: str, device: str, setting: int | None, concurrency: int = 1,
                 environ: Mapping[str, str] = os.environ, n_cores: int | None = None) -> None:
        self.name, self.host = name, host_of(name)
        self.concurrency = max(1, int(concurrency))
        self.cores = n_cores or cores()
        self.fixed: int | None = None
        self.why = ""
        if not device.startswith("cpu"):
            self.why = f"device {device}: torch's thread count left as it is"
        elif setting:
            self.fixed, self.why = int(setting), "compass_torch_threads"
        elif environ.get("OMP_NUM_THREADS"):
            self.why = "OMP_NUM_THREADS is set: torch's thread count left as it is"
        self.wanted: int | None = self.fixed if self.why else share(self.cores, 1,
                                                                    self.concurrency)
        if not self.why:
            self.why = f"{self.cores} cores shared by this host's CPU workers"

    @property
    def follows_peers(self) -> bool:
        """Whether the count depends on how many CPU workers share this host."""
        return self.fixed is None and self.wanted is not None

    def observe(self, workers: Iterable[Any]) -> None:
        """Recount the CPU workers on this host from the live records ``workers``."""
        if self.follows_peers:
            n = cpu_workers_on(self.host, self.name, workers) if self.host else 1
            self.wanted = share(self.cores, n, self.concurrency)

    def apply(self, **_: Any) -> None:
        """Set torch's thread count in this thread if it is not what it should be (a
        ``task_prerun`` handler as well: it runs in the thread that runs the task)."""
        if self.wanted is None:
            return
        try:
            import torch
        except ImportError:
            return
        if torch.get_num_threads() != self.wanted:
            torch.set_num_threads(self.wanted)
            logger.info("compass: worker %s runs torch on %d thread(s) (%s)", self.name,
                        self.wanted, self.why)
