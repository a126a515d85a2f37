"""This worker's record in the state store: published on change and as its heartbeat.

Producers plan on what this publishes (memory, resident models, speeds, served
demand); the beat Redis stamps on each publish is the worker's liveness. Whether
this worker may judge its peers follows from how long its own publishes have
succeeded without a break.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..planner.types import WorkerView
from ..state.connection import StateUnavailable

if TYPE_CHECKING:
    from ..cache import ModelCache
    from ..context import CompassContext
    from ..settings import CompassSettings
    from .hop import DispatchHop
    from .overhead import HandlerCpu
    from .served import RankFollower, ServedDemand

logger = logging.getLogger("compass_celery.worker")


class RecordPublisher:
    """Publishes one worker's record: when woken by a change, and every refresh interval."""

    def __init__(self, compass: CompassContext, name: str, queue: str, cfg: CompassSettings,
                 cache: ModelCache, served: ServedDemand, rank: RankFollower | None,
                 stopping: threading.Event, hop: DispatchHop, cpu: HandlerCpu) -> None:
        self.compass, self.name, self.queue, self.cfg = compass, name, queue, cfg
        self.cache, self.served, self.rank, self._stopping = cache, served, rank, stopping
        self.hop, self.cpu = hop, cpu
        # the tasks running here now (``TaskPath.spans``), set once the task path exists
        self.running: Callable[[], tuple[tuple[float, float, float], ...]] = tuple
        self.wake = threading.Event()  # set by a task's end, a load or an eviction
        self._state_down, self._published = False, None
        self._last_publish_ok = 0.0
        # Since when our own publishes have succeeded without a break (monotonic); a
        # worker judges peers only after a full heartbeat timeout of that, so after a
        # Redis outage every live peer has re-published before anyone is called dead.
        self._publish_ok_since: float | None = None
        self._born = time.time()

    def view(self) -> WorkerView:
        """This worker's record as the planner sees it: memory, resident models and those
        being loaded, the tasks running, speeds."""
        c = self.cache
        return WorkerView(
            name=self.name, queue=self.queue, device=c.device,
            gpu_total_mb=c.total_mb, gpu_free_mb=max(0.0, c.free_mb),
            resident=frozenset(c.resident()), host_resident=frozenset(c.host_resident()),
            speed=self.cfg.speed, load_mb_per_s=self.cfg.load_mb_per_s,
            host_load_mb_per_s=self.cfg.host_load_mb_per_s,
            # liveness is the beat Redis stamps on every publish; the record's own time
            # stays fixed, so an unchanged record is byte-identical and readers reuse it
            net_mb_per_s=self.cfg.net_mb_per_s, heartbeat=self._born,
            served=self.served.published(),
            hop_ms=self.hop.ms(), loading=c.in_flight(), running=self.running())

    def publish(self, if_changed: bool = False) -> bool:
        """Publish this worker's record and cache counters; False while the store is down.
        ``if_changed``: only a changed record, or the beat when its interval is up."""
        c, view = self.cache, self.view()
        if if_changed and view == self._published and not self._state_down and \
                time.monotonic() - self._last_publish_ok < self.cfg.state_refresh_s:
            return True
        try:
            cpu_ms, tasks = self.cpu.totals()
            self.compass.store.publish(view, pid=os.getpid(), hits=c.hits,
                                       misses=c.misses, loads=c.loads, evictions=c.evictions,
                                       tasks=tasks, compass_cpu_ms=round(cpu_ms, 1))
        except StateUnavailable as exc:
            if not self._state_down:
                logger.warning("compass: cannot publish worker state: %s", exc)
            self._state_down = True
            self._publish_ok_since = None
            return False
        if self._state_down:
            logger.warning("compass: state store back; worker %s re-published", self.name)
            self._state_down = False
        self._last_publish_ok, self._published = time.monotonic(), view
        if self._publish_ok_since is None:
            self._publish_ok_since = self._last_publish_ok
        return True

    def may_judge_peers(self) -> bool:
        """Only a worker that has reached Redis without a break for a whole heartbeat
        timeout judges others: after an outage, live peers re-publish first."""
        timeout = self.cfg.heartbeat_timeout_s
        now = time.monotonic()
        return (self._publish_ok_since is not None
                and now - self._publish_ok_since >= timeout
                and now - self._last_publish_ok < timeout / 2)

    def loop(self) -> None:
        """Publish when woken (only a changed record) and at every refresh interval."""
        while not self._stopping.is_set():
            woken = self.wake.wait(self.cfg.state_refresh_s)
            self.wake.clear()
            if not self._stopping.is_set():
                self.publish(if_changed=woken)
                if self.rank is not None:
                    self.rank.maybe_refresh()
