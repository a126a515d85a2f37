"""Autoscaling from the plan: how many workers, which models a new one preloads, which
one to remove, and damping so the fleet does not flap.

A queue-length autoscaler (KEDA's Redis-lists scaler, Ray Serve's ongoing requests)
sees work only once it waits. The planner knows more, per SLO class: the jobs arriving
per second, the GPU work each job plans per model, how long each model takes to load,
which worker holds what, and each class's deadline. The rule:

1. **Work now.** Each class ``c`` asks ``rate_c x work_c`` GPU ms per second (over the
   fleet's mean speed). A worker may be busy a share ``rho_c`` of its time
   (:func:`~compass_celery.planner.capacity.target_utilisation`, the capacity signal's
   M/M/1 bound on the class's critical path and deadline). A class waits only behind
   work at its priority level or above (``planner.priority``): level ``L`` needs
   ``sum_{c at L} work_c / rho_c + sum_{c above L} work_c / rho_L`` (``rho_L``: the
   tightest bound at ``L``), and the work needs the largest of the levels' numbers (one
   level: ``sum_c work_c / (1000 rho_c)``, as if each class had workers of its own),
   plus the queued work beyond what each worker can
   run within the tightest deadline, drained over the horizon (the queueing the
   utilisation bound allows is already in the first term; only a backlog past it means
   the rate estimate lags). The rate is the window's less one standard error of its
   Poisson noise (:class:`RateWindow`), so that the damper's hold of the window's largest
   recommendation does not hold the noise's largest.
2. **Over a horizon.** The same with each class's rate moved along its trend for
   ``horizon_s`` (a rising rate asks for workers before the queue shows it; a falling
   one is not counted on: the horizon takes the larger of the two). The horizon is a
   new worker's cold start: one asked for now cannot take work sooner, and a longer
   look ahead buys workers before anything could use them.
3. **Memory.** At least as many workers as the replicas the work calls for take GPU
   memory (``demand.replica_targets``, each model's copies at ``REPLICA_BUSY``).
4. **Damping** (:class:`Damper`): up at once to the larger of now and the horizon;
   down only to the largest target seen over the last ``down_window_s`` (as the
   Kubernetes HPA's scale-down stabilisation), so a lull shorter than the window
   changes nothing.
5. **Preload** (:func:`preload_hints`): a new worker loads the models whose copies are
   furthest below their replica target, most-asked first, as many as fit its memory.
6. **Remove** (:func:`choose_removals`): the worker whose loss costs least: its queued
   work plus, per resident model, the model's share of work held by that copy when the
   model has no spare copy (a surplus copy costs nothing). It is drained (the real
   cluster's SIGTERM hand-back; the simulator's draining worker), so nothing is lost.

Pure: no I/O, no Celery. The simulator (``sim.scaling``) calls these functions, as a
provider on a real cluster would.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .capacity import DEFAULT_MAX_UTIL, target_utilisation
from .demand import REPLICA_BUSY, replica_targets
from .types import ModelDemand, WorkerView

#: Seconds ahead the rule looks (the rate's trend is followed that far); a provider sets
#: it to its workers' cold start (a worker asked for now takes work no sooner).
DEFAULT_HORIZON_S = 30.0
#: Seconds a lower target must hold before the fleet shrinks to it.
DEFAULT_DOWN_WINDOW_S = 300.0
#: Seconds of arrivals the rate is measured over.
DEFAULT_RATE_WINDOW_S = 30.0
#: The work term's factor (1: each class at its M/M/1 utilisation bound). Below 1: the
#: bound is per worker, and a fleet of several pools its queueing (a task waits for the
#: first of them to free up), so each may run busier. 0.93, the cheapest of 0.9, 0.93 and
#: 0.95 that kept >= 99% of admitted jobs in time and at least KEDA's share of all jobs
#: on the simulator's diurnal, bursty and step days, seeds 0 to 2, with the work counted
#: by priority level (0.9 held it when every class was summed as one level, and missed it
#: on the bursty day's seed 2 by level; docs/results/autoscale-sim-2.txt).
DEFAULT_HEADROOM = 0.93
#: Sigmas of Poisson noise a change between the window's halves must pass to count as a
#: trend. Each tick tests it afresh, so noise passes 2 sigma every few dozen ticks and the
#: down window holds the worker it added; 3 sigma measured 2% fewer GPU-hours on the
#: simulator's traces, with all-jobs attainment within the seeds' spread on the diurnal
#: day but 0.7 points lower on the step day (before the noise discount, in an earlier
#: version of docs/results/autoscale-sim.txt), so 2 stays.
DEFAULT_TREND_SIGMA = 2.0
#: Standard errors of Poisson noise taken off the window's rate. The damper holds the
#: largest recommendation of its down window; each is read from a noisy count, so the
#: largest of a window's worth sits about one standard error above the true rate, and
#: without this discount the fleet held a worker more than the rate asked for (mean 4.29
#: workers against 3.83 undamped, 3.76 at the true rate, on the simulator's diurnal day).
#: A burst past the up-fast test and a window with a rising trend are taken whole: the
#: discount is for a steady rate's noise, and a rise discounted lags further.
DEFAULT_NOISE_SIGMA = 1.0


@dataclass(frozen=True)
class ClassLoad:
    """One SLO class as the rule sees it: its arrival rate, the work one of its jobs
    plans per model, and its deadline."""

    name: str
    #: Jobs per second now (windowed, :class:`RateWindow`).
    rate_per_s: float
    #: GPU ms one job plans per model (at speed 1).
    work_ms: Mapping[str, float]
    #: The job's deadline; None: none (the utilisation cap applies).
    deadline_ms: float | None = None
    #: The job's critical path, ms at speed 1 (the service time its deadline must cover).
    path_ms: float = 0.0
    #: The rate's change, jobs per second per second (0: flat).
    trend_per_s2: float = 0.0
    #: Its jobs' priority level (``planner.priority``: 9 runs first); a class waits
    #: behind work at its level and above only.
    priority: int = 0


@dataclass(frozen=True)
class Member:
    """One worker as the rule sees it."""

    name: str
    resident: frozenset[str] = frozenset()
    #: Work queued and running on it, ms.
    backlog_ms: float = 0.0
    gpu_mb: float = 0.0
    speed: float = 1.0
    #: False while it starts (cold): counted as capacity coming, never removed.
    ready: bool = True


@dataclass(frozen=True)
class Need:
    """Workers the load needs, and the terms behind the number."""

    now: int
    horizon: int
    work_workers: float = 0.0
    backlog_workers: float = 0.0
    by_memory: int = 0
    #: Model -> copies the work calls for.
    targets: Mapping[str, int] = field(default_factory=dict)


def _model_demand(classes: Sequence[ClassLoad], speed: float, ahead_s: float
                  ) -> dict[str, ModelDemand]:
    """Model -> GPU ms per second and uses per second, with rates ``ahead_s`` along
    their trend (never below 0)."""
    out: dict[str, list[float]] = {}
    for c in classes:
        rate = max(0.0, c.rate_per_s + c.trend_per_s2 * ahead_s)
        for model, ms in c.work_ms.items():
            acc = out.setdefault(model, [0.0, 0.0])
            acc[0] += rate * ms / speed
            acc[1] += rate
    return {m: ModelDemand(ms, n) for m, (ms, n) in out.items()}


def _work_workers(classes: Sequence[ClassLoad], speed: float, ahead_s: float,
                  max_util: float, headroom: float = 1.0, by_level: bool = True) -> float:
    """Workers the classes' work needs at their utilisation bounds (step 1), times
    ``headroom``. ``by_level``: each priority level counts the work above it at its own
    bound and the largest level's number is needed (a batch class fills the room an
    interactive class's bound leaves idle); otherwise every class sums as one level."""
    levels: dict[int, list[float]] = {}  # level -> [sum work / rho, work, tightest rho]
    for c in classes:
        rate = max(0.0, c.rate_per_s + c.trend_per_s2 * ahead_s)
        work = rate * sum(c.work_ms.values()) / speed
        util = target_utilisation(c.path_ms / speed, c.deadline_ms, max_util)
        acc = levels.setdefault(c.priority if by_level else 0, [0.0, 0.0, 1.0])
        acc[0] += work / (1000.0 * util)
        acc[1] += work
        acc[2] = min(acc[2], util)
    best, above = 0.0, 0.0
    for level in sorted(levels, reverse=True):
        own, work, util = levels[level]
        best = max(best, own + above / (1000.0 * util))
        above += work
    return best * headroom


def workers_needed(classes: Sequence[ClassLoad], members: Sequence[Member],
                   sizes_mb: Mapping[str, float], *, horizon_s: float = DEFAULT_HORIZON_S,
                   max_util: float = DEFAULT_MAX_UTIL, busy: float = REPLICA_BUSY,
                   min_workers: int = 1, headroom: float = DEFAULT_HEADROOM,
                   by_level: bool = True) -> Need:
    """Workers needed now and over ``horizon_s`` (steps 1 to 3 of the module's rule);
    ``headroom`` scales the work term (below 1 plans the workers busier than the M/M/1
    bound, which is conservative for a fleet: M/M/c waits less at the same busy share);
    ``by_level`` False sums every class as one priority level."""
    if not horizon_s > 0:
        raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
    if not headroom > 0:
        raise ValueError(f"headroom must be > 0, got {headroom!r}")
    if not 0 < max_util <= 1:
        raise ValueError(f"max_util must be in (0, 1], got {max_util!r}")
    speed = sum(m.speed for m in members) / len(members) if members else 1.0
    gpu_mb = max((m.gpu_mb for m in members), default=0.0)
    tightest = min((c.deadline_ms for c in classes if c.deadline_ms), default=0.0)
    excess = sum(max(m.backlog_ms / m.speed - tightest, 0.0) for m in members)
    backlog = excess / (1000.0 * horizon_s)

    def count(ahead_s: float) -> tuple[int, float, int, dict[str, int]]:
        targets = replica_targets(_model_demand(classes, speed, ahead_s), busy=busy)
        replica_mb = sum(n * float(sizes_mb.get(m, 0.0)) for m, n in targets.items())
        by_memory = math.ceil(replica_mb / gpu_mb - 1e-9) if gpu_mb > 0 else 0
        work = _work_workers(classes, speed, ahead_s, max_util, headroom, by_level)
        n = max(math.ceil(work + backlog - 1e-9), by_memory,
                max(targets.values(), default=0), min_workers)
        return n, work, by_memory, targets

    now, work, by_memory, targets = count(0.0)
    ahead = max(now, count(horizon_s)[0])
    return Need(now, ahead, work, backlog, by_memory, targets)


class Damper:
    """Scale up at once, down only after a stable window (step 4): the target is the
    largest recommendation seen over the last ``down_window_s``."""

    def __init__(self, down_window_s: float = DEFAULT_DOWN_WINDOW_S) -> None:
        if down_window_s < 0:
            raise ValueError(f"down_window_s must be >= 0, got {down_window_s!r}")
        self.down_window_s = down_window_s
        self._seen: deque[tuple[float, int]] = deque()  # (time s, recommendation)

    def step(self, now_s: float, wanted: int) -> int:
        """The fleet size to hold at ``now_s`` given this recommendation."""
        seen = self._seen
        while seen and seen[0][0] < now_s - self.down_window_s:
            seen.popleft()
        while seen and seen[-1][1] <= wanted:
            seen.pop()  # a later, larger recommendation covers it for the whole window
        seen.append((now_s, wanted))
        return seen[0][1]


class RateWindow:
    """Arrivals per class over the last ``window_s``: the rate, and its trend (the
    second half's rate against the first half's, per second). Up fast: when the last
    ``1 / SHORT`` of the window saw clearly more (a count Poisson noise reaches with
    probability under :attr:`BURST_P`, one-sided 3 sigma) than the
    window's rate explains, the rate is that short stretch's, so a burst counts within
    a fraction of the window. A trend counts only past ``trend_sigma`` sigma of the
    halves' Poisson noise. Without a burst or a rising trend, the window's rate is
    reported less ``noise_sigma`` standard errors of its count (``sqrt(n) / window``),
    floored at 0: a controller that holds the largest of many noisy readings
    (:class:`Damper`) otherwise holds the noise."""

    #: The short stretch is this fraction of the window.
    SHORT = 8
    #: The chance of the short stretch's count under a steady rate below which it is a
    #: burst: the one-sided tail of 3 sigma, taken from the Poisson law itself. The normal
    #: approximation (``mean + 3 sqrt(mean)``) fires far more often on the few arrivals a
    #: short stretch holds (mean 0.8: at 4 arrivals, 0.9% a tick instead of 0.135%), and
    #: each false burst bought workers that the down window then held.
    BURST_P = 0.00135

    def __init__(self, window_s: float = DEFAULT_RATE_WINDOW_S,
                 trend_sigma: float = DEFAULT_TREND_SIGMA,
                 noise_sigma: float = DEFAULT_NOISE_SIGMA,
                 short_s: float | None = None, recent_on_trend: int = 0,
                 pooled: bool = False) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        #: The burst test's short stretch (None: ``1 / SHORT`` of the window): set on its
        #: own, a longer window steadies the rate without seeing bursts later.
        self.short_s = window_s / self.SHORT if short_s is None else min(short_s, window_s)
        if not self.short_s > 0:
            raise ValueError(f"short_s must be > 0, got {short_s!r}")
        if not trend_sigma >= 0:
            raise ValueError(f"trend_sigma must be >= 0, got {trend_sigma!r}")
        if not noise_sigma >= 0:
            raise ValueError(f"noise_sigma must be >= 0, got {noise_sigma!r}")
        self.window_s, self.trend_sigma = window_s, trend_sigma
        self.noise_sigma = noise_sigma
        #: 1: a rise past the trend test reads the recent half's rate when higher; 2: a
        #: fall reads it too, when lower (0: the window's mean). The mean lags the
        #: window's end by half the window.
        if recent_on_trend not in (0, 1, 2):
            raise ValueError(f"recent_on_trend must be 0, 1 or 2, got {recent_on_trend!r}")
        self.recent_on_trend = recent_on_trend
        #: The burst test also runs on every class's arrivals together (more counts, more
        #: power): when the total is a burst, each class whose short stretch saw more than
        #: its window's rate explains takes that stretch's rate.
        self.pooled = pooled
        self._times: dict[str, deque[float]] = {}

    def observe(self, name: str, t_s: float, count: int = 1) -> None:
        """``count`` arrivals of class ``name`` at ``t_s`` (a bucket counted elsewhere);
        arrivals come in time order."""
        self._times.setdefault(name, deque()).extend([t_s] * count)

    def rates(self, now_s: float) -> dict[str, tuple[float, float]]:
        """Class -> (jobs per second over the window, trend in jobs per second per
        second). Before one window has passed, the rate is over the time seen."""
        out: dict[str, tuple[float, float]] = {}
        half = self.window_s / 2.0
        pooled = self.pooled and self._pooled_burst(now_s)
        for name, times in self._times.items():
            while times and times[0] < now_s - self.window_s:
                times.popleft()
            span = min(self.window_s, max(now_s, 1e-9))
            recent = sum(1 for t in reversed(times) if t >= now_s - half) if times else 0
            rate = len(times) / span
            trend = 0.0
            older = len(times) - recent
            # a change the counts' Poisson noise explains is no trend
            if span >= self.window_s and abs(recent - older) > \
                    self.trend_sigma * math.sqrt(recent + older):
                trend = (recent - older) / half / half
            short_s = self.short_s
            last = sum(1 for t in reversed(times) if t >= now_s - short_s)
            expect = rate * short_s
            if span >= self.window_s and (_poisson_tail(last, expect) < self.BURST_P
                                          or (pooled and last > expect)):
                rate = last / short_s  # a burst past 3 sigma: taken as it is
            elif trend > 0 and self.recent_on_trend:
                rate = max(rate, recent / half)
            elif trend < 0 and self.recent_on_trend == 2:
                rate = min(rate, recent / half)
            elif trend <= 0:  # a steady reading less its Poisson noise; a rise as it is
                rate = max(rate - self.noise_sigma * math.sqrt(len(times)) / span, 0.0)
            out[name] = (rate, trend)
        return out


    def _pooled_burst(self, now_s: float) -> bool:
        """Whether every class's arrivals together over the short stretch are a burst."""
        if now_s < self.window_s:
            return False
        total = last = 0
        for times in self._times.values():
            total += sum(1 for t in times if t >= now_s - self.window_s)
            last += sum(1 for t in times if t >= now_s - self.short_s)
        expect = total / self.window_s * self.short_s
        return _poisson_tail(last, expect) < self.BURST_P


def _poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(``mean``): how often a steady rate gives ``k`` or more
    arrivals where ``mean`` are expected."""
    if k <= 0:
        return 1.0
    term = total = math.exp(-mean)
    for i in range(1, k):
        term *= mean / i
        total += term
    return max(0.0, 1.0 - total)


def members_from(workers: Iterable[WorkerView]) -> list[Member]:
    """The live workers of a snapshot as the rule sees them (a real provider's input):
    resident and loading models, backlog with planned-not-sent work, GPU and speed."""
    return [Member(w.name, frozenset(w.resident) | frozenset(w.loading),
                   w.backlog_ms + w.pending_ms, w.gpu_total_mb, w.speed) for w in workers]


def _holders(members: Iterable[Member]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in members:
        for model in m.resident:
            out[model] = out.get(model, 0) + 1
    return out


def preload_hints(new: int, need: Need, members: Sequence[Member],
                  sizes_mb: Mapping[str, float], gpu_mb: float) -> list[tuple[str, ...]]:
    """The models each of ``new`` workers should load on start (step 5): most-missing
    copies first (the work per missing copy breaks ties), as many as fit ``gpu_mb``.
    ``members`` starting already count with what they were told to load."""
    missing = {m: n - h for m, n in need.targets.items()
               if (h := _holders(members).get(m, 0)) < n}
    out: list[tuple[str, ...]] = []
    for _ in range(new):
        free, chosen = gpu_mb, []
        for model in sorted(missing, key=lambda m: (-missing[m], m)):
            size = float(sizes_mb.get(model, 0.0))
            if missing[model] > 0 and size <= free:
                chosen.append(model)
                free -= size
        for model in chosen:
            missing[model] -= 1
        out.append(tuple(chosen))
    return out


def removal_cost(member: Member, need: Need, holders: Mapping[str, int]) -> float:
    """What removing ``member`` costs (step 6): its queued work, plus, per resident model
    whose copies are not more than its target, that copy's share of a loaded model
    (counted as 1000 ms: a reload on another worker)."""
    cost = member.backlog_ms
    for model in member.resident:
        want = need.targets.get(model, 0)
        if want and holders.get(model, 0) <= want:
            cost += 1000.0 / max(holders.get(model, 1), 1)
    return cost


def choose_removals(count: int, members: Sequence[Member], need: Need) -> list[str]:
    """The ``count`` ready workers to drain, cheapest loss first (step 6); ties go to the
    last name, so the same fleet always loses the same worker."""
    left = [m for m in members if m.ready]
    holders = _holders(members)
    out: list[str] = []
    for _ in range(min(count, len(left))):
        victim = min(reversed(sorted(left, key=lambda m: m.name)),
                     key=lambda m: removal_cost(m, need, holders))
        out.append(victim.name)
        left.remove(victim)
        for model in victim.resident:
            holders[model] -= 1
    return out


@dataclass(frozen=True)
class Decision:
    """What the fleet should do now."""

    target: int
    need: Need
    #: Models per worker to start (one tuple each; empty: none to add).
    add: tuple[tuple[str, ...], ...] = ()
    #: Workers to drain.
    remove: tuple[str, ...] = ()


def decide(classes: Sequence[ClassLoad], members: Sequence[Member],
           sizes_mb: Mapping[str, float], damper: Damper, now_s: float, *,
           horizon_s: float = DEFAULT_HORIZON_S, max_util: float = DEFAULT_MAX_UTIL,
           min_workers: int = 1, max_workers: int | None = None,
           gpu_mb: float | None = None, headroom: float = DEFAULT_HEADROOM,
           by_level: bool = True) -> Decision:
    """The whole rule: the need, damped, and the workers to add (with their preloads)
    or drain. ``members`` are the workers alive and starting (not those draining)."""
    need = workers_needed(classes, members, sizes_mb, horizon_s=horizon_s,
                          max_util=max_util, min_workers=min_workers, headroom=headroom,
                          by_level=by_level)
    wanted = max(need.now, need.horizon)
    if max_workers is not None:
        wanted = min(wanted, max_workers)
    target = damper.step(now_s, wanted)
    have = len(members)
    if target > have:
        mb = gpu_mb if gpu_mb is not None else max((m.gpu_mb for m in members), default=0.0)
        return Decision(target, need, tuple(preload_hints(target - have, need, members,
                                                          sizes_mb, mb)))
    if target < have:
        return Decision(target, need, remove=tuple(choose_removals(have - target, members,
                                                                   need)))
    return Decision(target, need)
