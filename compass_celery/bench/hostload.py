"""How busy the benchmark's own machine was while the jobs ran, and who kept it busy.

A benchmark on one machine shares its cores between the producer (planning and sending
every job), Redis and every worker. When they run out, the gaps between tasks lengthen
and queues grow for reasons a cluster of GPU hosts would not show, and a latency or a
comparison with the simulator measures the machine rather than the scheduler. The
sampler reads ``/proc`` every ``interval_s`` while the jobs run: the share of all cores
busy in each interval, and the CPU seconds each role's processes used, so that a result
says whether its host kept up and what one task cost it. Linux only; elsewhere the
benchmark records no host figures.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: An interval in which the cores were at least this busy counts as saturated.
SATURATED = 0.95

_PROC_STAT = "/proc/stat"


def cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies over all cores since boot; ``None`` where there is no
    ``/proc/stat``. Idle and waiting on I/O are not busy."""
    try:
        with open(_PROC_STAT) as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - fields[3] - fields[4], total


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat text after the command name, which may hold
    spaces and parentheses: they start after its last ``)`` (the state is field 0)."""
    return stat.rpartition(")")[2].split()


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a live process has used; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = stat_fields(f.read())
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summarise(busy: Sequence[float], cpu_s: Mapping[str, float], window_s: float,
              cores: int, tasks: int, busy_s: float | None = None) -> dict[str, Any]:
    """The host figures a result carries: busy share at the median and p90 of the
    intervals, the share of intervals saturated, each role's CPU seconds and ms a task
    (``tasks``: the task executions in the window), and the CPU seconds of everything
    else on the machine (``busy_s``, all cores' busy time, less the roles'): another
    program's load shows there, not in the roles."""
    shares = np.asarray(busy, dtype=float)
    summary: dict[str, Any] = {"cores": cores, "window_s": round(window_s, 2),
                               "samples": int(shares.size)}
    if shares.size:
        summary.update(busy_median=round(float(np.median(shares)), 3),
                       busy_p90=round(float(np.percentile(shares, 90)), 3),
                       saturated_share=round(float(np.mean(shares >= SATURATED)), 3))
    summary["cpu_s"] = {role: round(s, 2) for role, s in cpu_s.items()}
    if busy_s is not None:
        summary["others_cpu_s"] = round(max(0.0, busy_s - sum(cpu_s.values())), 2)
    summary["cpu_ms_per_task"] = {role: round(1000.0 * s / tasks, 3) if tasks else None
                                  for role, s in cpu_s.items()}
    return summary


class HostLoad:
    """Samples the machine's busy share and the CPU of the roles' processes from
    :meth:`start` to :meth:`stop`; :meth:`summary` gives what it saw."""

    def __init__(self, roles: Mapping[str, Sequence[int]], interval_s: float = 0.1) -> None:
        self.roles = {role: list(pids) for role, pids in roles.items()}
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._busy: list[float] = []
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}  # a process that exits keeps its last reading
        self._span: list[tuple[float, float]] = []  # all cores' (busy, total): first, last
        self._thread = threading.Thread(target=self._run, name="compass-hostload", daemon=True)
        self._started_at = self._stopped_at = 0.0

    def start(self) -> HostLoad:
        """Take the first readings and sample from now on."""
        self._read_processes(first=True)
        self._started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and take the last readings."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._read_processes()
        self._stopped_at = time.monotonic()

    def summary(self, tasks: int, handlers_ms: float | None = None
                ) -> dict[str, Any] | None:
        """The figures over the window, ``tasks`` task executions in it (see
        :func:`summarise`), and ``handlers_ms``: of the workers' CPU a task, what compass's
        own handlers spent, as they published it. ``None`` where there is no ``/proc``."""
        if cpu_times() is None:
            return None
        cpu = {role: sum(self._last.get(p, 0.0) - self._first.get(p, 0.0) for p in pids)
               for role, pids in self.roles.items()}
        busy_s = ((self._span[-1][0] - self._span[0][0]) / os.sysconf("SC_CLK_TCK")
                  if len(self._span) > 1 else None)
        summary = summarise(self._busy, cpu, self._stopped_at - self._started_at,
                            os.cpu_count() or 1, tasks, busy_s)
        summary["compass_handlers_ms_per_task"] = handlers_ms
        return summary

    def _run(self) -> None:
        last = cpu_times()
        if last is not None:
            self._span[:] = [last, last]
        while last is not None and not self._stop.wait(self.interval_s):
            now = cpu_times()
            if now is None:
                return
            spent = now[1] - last[1]
            if spent > 0:
                self._busy.append((now[0] - last[0]) / spent)
            last = now
            self._span[1] = now
            self._read_processes()

    def _read_processes(self, first: bool = False) -> None:
        for pids in self.roles.values():
            for pid in pids:
                cpu = process_cpu_s(pid)
                if cpu is None:
                    continue
                if first:
                    self._first[pid] = cpu
                self._last[pid] = cpu


def host_line(host: Mapping[str, Any]) -> str:
    """One line for the benchmark's output: how busy the host was and what a task cost."""
    ours = host.get("compass_handlers_ms_per_task")
    per_task = ", ".join(
        f"{role} {ms:.1f} ms" + (f" (compass's handlers {ours:.1f} ms)"
                                 if role == "workers" and ours is not None else "")
        for role, ms in host["cpu_ms_per_task"].items() if ms is not None)
    busy = (f"{100 * host['busy_median']:.0f}% busy at the median, saturated in "
            f"{100 * host['saturated_share']:.0f}% of {host['samples']} samples"
            if host.get("samples") else "no samples")
    others = host.get("others_cpu_s")
    rest = f"; other programs {others:.1f} CPU s" if others else ""
    return f"  host: {host['cores']} cores, {busy}; CPU a task: {per_task or 'none'}{rest}"
