"""The simulated autoscaling provider, its billing, and the autoscalers it compares.

A :class:`Fleet` adds and drains simulated workers on a running
:class:`~compass_celery.sim.runner.Simulation`: a new worker joins the cluster after a
cold start (process or container start, ``cold_start_s``), then loads the models it
was told to preload, one after another at its load bandwidth, while already taking
work (a plan counts what is left of a load in flight). A drained worker leaves the
snapshot at once, runs what it holds and then stops (the real cluster's SIGTERM
hand-back leaves nothing behind either). Every worker is billed per second from the
moment it is asked for until it stops.

Autoscalers (each ticks every ``poll_s`` and sees the same cluster):

- ``compass-plan``: :func:`compass_celery.planner.scaling.decide` on the windowed
  arrival rate per class, each class's planned work per model and deadline, the
  workers' resident models and backlogs; new workers preload its hints; it chooses the
  worker to drain.
- ``keda-queue``: KEDA's Redis-lists scaler: ``ceil(messages / listLength)`` workers,
  messages being every task queued or running (as the Celery scalers count), listLength
  5; up at once, down after the HPA's 300 s stabilisation window. New workers start
  cold; Kubernetes removes the newest pod.
- ``ray-ongoing``: Ray Serve's target ongoing requests (2 per replica): up once the
  wish has held for ``upscale_delay_s`` (30), down once it has held for
  ``downscale_delay_s`` (600); cold starts, newest removed.
- ``fixed-peak``: the workers the rule asks for at the trace's peak rate, from the
  start, warm, never changed.

All run the compass placement policy and the same admission. Real periods (polling,
delays, the cold start) are divided by the trace's compression, as the trace's hours
are; model loads take their real time. GPU-hours are reported at the trace's scale
(worker-seconds x compression / 3600). Pure: no I/O.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..planner.capacity import DEFAULT_MAX_UTIL
from ..planner.cost import MS_PER_S
from ..planner.priority import resolve_priority
from ..planner.scaling import (
    DEFAULT_HEADROOM,
    DEFAULT_NOISE_SIGMA,
    DEFAULT_TREND_SIGMA,
    ClassLoad,
    Damper,
    Decision,
    Member,
    RateWindow,
    decide,
    workers_needed,
)
from ..workload import WorkerSpec, Workload
from .cluster import SimWorker
from .runner import Simulation
from .stats import summarize
from .traces import Trace

AUTOSCALERS = ("compass-plan", "keda-queue", "ray-ongoing", "fixed-peak")
#: compass-plan without one of its parts: new workers start cold, or the newest is drained.
PLAN_VARIANTS = ("no-hints", "newest")
#: Real seconds from asking for a worker to its process taking work (container pull
#: cached, image start, framework import; model loads come after).
COLD_START_S = 60.0
#: KEDA's defaults: pollingInterval, the HPA's scale-down stabilisation (the
#: cooldownPeriod only governs scaling to zero), the Redis-lists scaler's listLength.
KEDA_POLL_S, KEDA_DOWN_S, KEDA_LIST_LENGTH = 30.0, 300.0, 5
#: Ray Serve's defaults: target_ongoing_requests, upscale_delay_s, downscale_delay_s.
RAY_TARGET, RAY_UP_S, RAY_DOWN_S = 2.0, 30.0, 600.0
#: compass-plan's rate window and horizon, real seconds (its down window is KEDA's); the
#: horizon is the cold start unless set (``compass-plan:horizon=S``): a worker asked for
#: now takes work no sooner (it was 120 s, twice the cold start, until the per-tick
#: decisions showed it buying workers for trends no worker could yet serve).
PLAN_WINDOW_S, PLAN_HORIZON_S = 480.0, COLD_START_S


@dataclass
class Fleet:
    """Adds, drains and bills simulated workers on one simulation (the simulated
    provider)."""

    sim: Simulation
    template: WorkerSpec
    cold_ms: float
    #: name -> when it was asked for (workload ms), for every worker not yet stopped.
    since: dict[str, float] = field(default_factory=dict)
    #: name -> the models it was told to preload, while it starts.
    starting: dict[str, tuple[str, ...]] = field(default_factory=dict)
    billed_ms: float = 0.0
    cold_starts: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)
    _made: int = 0

    def __post_init__(self) -> None:
        now = self.sim.engine.now
        for w in self.sim.cluster.workers:
            self.since[w.name] = now
        self.sim.cluster.on_drained = self._stopped
        self._mark()

    def _mark(self) -> None:
        self.timeline.append((self.sim.engine.now / MS_PER_S, len(self.since)))

    def members(self) -> list[Member]:
        """The workers taking work and those starting (with their hints as resident)."""
        out = [Member(w.name, frozenset(w.decider.resident) | frozenset(w.decider.loading),
                      w.backlog_ms, w.spec.gpu_mem_mb, w.spec.speed)
               for w in self.sim.cluster.workers]
        out += [Member(name, frozenset(hint), 0.0, self.template.gpu_mem_mb,
                       self.template.speed, ready=False)
                for name, hint in self.starting.items()]
        return out

    def add(self, preload: tuple[str, ...] = ()) -> None:
        """Ask for a worker: it takes work after the cold start, then loads ``preload``."""
        self._made += 1
        spec = replace(self.template, name=f"s{self._made:04d}")
        self.since[spec.name] = self.sim.engine.now
        self.starting[spec.name] = preload
        self.cold_starts += 1
        self.sim.engine.after(self.cold_ms, self._up, spec)
        self._mark()

    def _up(self, spec: WorkerSpec) -> None:
        preload = self.starting.pop(spec.name)
        worker = self.sim.cluster.join(spec)
        worker.load(preload)

    def drain(self, name: str) -> None:
        """Take ``name`` out of placement; it stops once it has run what it holds."""
        self.sim.cluster.retire(self.sim.cluster.by_name[name])

    def _stopped(self, worker: SimWorker) -> None:
        began = self.since.pop(worker.name, None)
        if began is not None:
            self.billed_ms += self.sim.engine.now - began
            self._mark()

    def close(self, end_ms: float) -> None:
        """Bill every worker still up until ``end_ms`` (the run's end)."""
        for began in self.since.values():
            self.billed_ms += max(end_ms - began, 0.0)
        self.timeline.append((end_ms / MS_PER_S, len(self.since)))
        self.since.clear()

    def ready(self) -> list[SimWorker]:
        """The workers taking work, oldest first."""
        return list(self.sim.cluster.workers)

    def newest(self, count: int) -> list[str]:
        """The ``count`` most recently asked-for workers taking work (Kubernetes' pick)."""
        ready = {w.name for w in self.sim.cluster.workers}
        order = sorted((t, n) for n, t in self.since.items() if n in ready)
        return [n for _, n in order[::-1][:count]]


def messages(fleet: Fleet) -> int:
    """Tasks queued or running on the workers taking work (what a queue scaler counts)."""
    return sum(len(w.queue) + (w.running is not None) for w in fleet.ready())


def class_loads(workload: Workload
                ) -> dict[str, tuple[dict[str, float], float, float | None, int]]:
    """SLO class -> (GPU ms one of its jobs plans per model, its mean critical path in
    ms, its deadline, its priority level), averaged over its templates by the mix."""
    acc: dict[str, list[Any]] = {}
    total = sum(workload.mix.values())
    for name, weight in workload.mix.items():
        slo = workload.slo(name)
        cls = slo.name if slo is not None else "none"
        level = resolve_priority(slo.priority if slo is not None else None)
        entry = acc.setdefault(cls, [{}, 0.0, 0.0, slo.deadline_ms if slo else None, level])
        dag = workload.dags[name]
        share = weight / total
        for spec in dag.nodes.values():
            if spec.model is not None:
                entry[0][spec.model] = entry[0].get(spec.model, 0.0) + share * spec.exec_ms
        finish: dict[str, float] = {}
        for node in dag.topological_order():
            start = max((finish[p] for p in dag.preds(node)), default=0.0)
            finish[node] = start + dag.nodes[node].exec_ms
        entry[1] += share * max(finish.values(), default=0.0)
        entry[2] += share
    return {c: ({m: ms / e[2] for m, ms in e[0].items()}, e[1] / e[2], e[3], e[4])
            for c, e in acc.items()}


def loads_at(workload: Workload, rates: Mapping[str, tuple[float, float]]) -> list[ClassLoad]:
    """The classes at these (rate, trend) pairs, as :func:`planner.scaling.decide` takes
    them."""
    out = []
    for cls, (work, path, deadline, level) in class_loads(workload).items():
        rate, trend = rates.get(cls, (0.0, 0.0))
        out.append(ClassLoad(cls, rate, work, deadline, path, trend, level))
    return out


def reading(now_s: float, classes: Sequence[ClassLoad], members: Sequence[Member],
            d: Decision) -> dict[str, Any]:
    """One tick as the rule saw it: each class's (rate, trend), the fleet's backlogs
    (ready workers; a starting one is None), the need's terms and the damped target. The
    simulator's compass-plan and the real controller (``providers.Autoscaler``) record
    the same, so a run's decisions can be compared with its simulation's tick by tick."""
    need = d.need
    return {"t": round(now_s, 3),
            "rates": {c.name: [round(c.rate_per_s, 3), round(c.trend_per_s2, 4)]
                      for c in classes},
            "backlog_ms": [round(m.backlog_ms, 1) if m.ready else None for m in members],
            "now": need.now, "horizon": need.horizon,
            "work": round(need.work_workers, 3), "backlog": round(need.backlog_workers, 3),
            "target": d.target}


def class_rates(workload: Workload, rate: float) -> dict[str, tuple[float, float]]:
    """Class -> (jobs per second at a total of ``rate``, no trend), by the mix."""
    total = sum(workload.mix.values())
    out: dict[str, tuple[float, float]] = {}
    for name, weight in workload.mix.items():
        slo = workload.slo(name)
        cls = slo.name if slo is not None else "none"
        out[cls] = (out.get(cls, (0.0, 0.0))[0] + rate * weight / total, 0.0)
    return out


def steady_workers(workload: Workload, rate: float) -> int:
    """What the rule asks for at a steady ``rate`` with nothing queued."""
    spec = workload.cluster.workers[0]
    members = [Member("w", gpu_mb=spec.gpu_mem_mb, speed=spec.speed)]
    return workers_needed(loads_at(workload, class_rates(workload, rate)), members,
                          workload.models).now


def busy_s_per_job(workload: Workload) -> float:
    """GPU seconds one job of the mix plans, on average (its models' run times at the
    workers' speed): what any fleet serving it must hold busy per arrival."""
    rates = class_rates(workload, 1.0)
    speed = workload.cluster.workers[0].speed
    return sum(rates[cls][0] * sum(work.values())
               for cls, (work, _, _, _) in class_loads(workload).items()) / speed / MS_PER_S


def floor_gpu_hours(workload: Workload, trace: Trace, util: float = 1.0,
                    steps: int = 72_000) -> float:
    """The GPU-hours (trace scale) of an oracle fleet: it knows the rate curve, starts a
    worker the instant it is needed, loads nothing and keeps each worker ``util`` busy,
    holding ``ceil(rate x busy / util)`` whole workers (at least one) at every instant.
    No autoscaler that serves every job on whole workers can cost less, so no saving
    against a baseline row can exceed ``1 - floor / row``: the summary says so."""
    busy, dt = busy_s_per_job(workload), trace.duration_s / steps
    held = sum(max(1, math.ceil(trace.rate((i + 0.5) * dt) * busy / util - 1e-9))
               for i in range(steps))
    return held * dt * trace.compression / 3600.0


Tick = Callable[[Fleet, float], None]


#: compass-plan's sizing knobs (``compass-plan:KEY=VALUE+KEY=VALUE``): the work term's
#: factor (``planner.scaling``'s headroom), the utilisation cap, the rate window, horizon
#: (default: the cold start) and down window in real seconds, the trend's noise threshold
#: in sigmas, the standard errors taken off the window's rate (noise_sigma), whether
#: the work term counts priority levels (levels: 1, the default; 0 sums every class as
#: one level, the rule before), the burst test's short stretch in real seconds (short:
#: an eighth of the default window, kept when the window changes) and whether a window
#: with a trend reads its recent half (recent: 0 no, the default; 1 on a rise; 2 on a
#: rise and a fall; ``RateWindow.recent_on_trend``), and whether the burst test also
#: runs on all classes together (pooled: 0, the default, or 1).
PLAN_KNOBS = {"headroom": DEFAULT_HEADROOM, "max_util": DEFAULT_MAX_UTIL, "window": PLAN_WINDOW_S,
              "horizon": PLAN_HORIZON_S, "down": KEDA_DOWN_S,
              "trend_sigma": DEFAULT_TREND_SIGMA, "noise_sigma": DEFAULT_NOISE_SIGMA,
              "levels": 1.0, "short": PLAN_WINDOW_S / RateWindow.SHORT, "recent": 0.0,
              "pooled": 0.0}


def plan_knobs(variant: str) -> tuple[str, dict[str, float]]:
    """``variant`` -> (the part left out, or "", the knobs with their defaults filled)."""
    knobs, part = dict(PLAN_KNOBS), ""
    for item in filter(None, variant.split("+")):
        key, eq, value = item.partition("=")
        if not eq:
            if item not in PLAN_VARIANTS:
                raise ValueError(f"compass-plan's variants are {', '.join(PLAN_VARIANTS)}, "
                                 f"its knobs {', '.join(PLAN_KNOBS)} (KEY=VALUE), got {item!r}")
            part = item
            continue
        if key not in PLAN_KNOBS:
            raise ValueError(f"compass-plan's knobs are {', '.join(PLAN_KNOBS)}, got {key!r}")
        try:
            knobs[key] = float(value)
        except ValueError:
            raise ValueError(f"compass-plan knob {key}: {value!r} is not a number") from None
        if key == "recent" and knobs[key] not in (0.0, 1.0, 2.0):
            raise ValueError("compass-plan knob recent must be 0, 1 or 2")
        zero_ok = key in ("down", "trend_sigma", "noise_sigma", "levels", "recent", "pooled")
        if not knobs[key] >= 0 or (not zero_ok and not knobs[key] > 0):
            raise ValueError(f"compass-plan knob {key} must be > 0 (down, trend_sigma, "
                             f"noise_sigma, levels >= 0)")
    return part, knobs


def compass_plan(workload: Workload, stream: Sequence[tuple[float, str]], c: float,
                 variant: str = "", cold_start_s: float = COLD_START_S,
                 log: list[dict[str, Any]] | None = None) -> Tick:
    """The rule from the plan (``planner.scaling``), fed the arrivals as they come;
    ``variant`` leaves out one of its parts (``PLAN_VARIANTS``), to measure it, and sets
    its knobs (``PLAN_KNOBS``), to sweep them; the horizon is ``cold_start_s`` unless a
    knob sets it. With ``log``, each tick's :func:`reading` is appended to it."""
    part, knobs = plan_knobs(variant)
    if not any(item.startswith("horizon=") for item in variant.split("+")):
        knobs["horizon"] = cold_start_s
    window = RateWindow(knobs["window"] / c, knobs["trend_sigma"], knobs["noise_sigma"],
                        knobs["short"] / c, int(knobs["recent"]), knobs["pooled"] > 0)
    damper = Damper(knobs["down"] / c)
    classes = {name: (s.name if (s := workload.slo(name)) is not None else "none")
               for name in workload.dags}
    seen = [0]

    def tick(fleet: Fleet, now_s: float) -> None:
        while seen[0] < len(stream) and stream[seen[0]][0] <= now_s * MS_PER_S:
            t, name = stream[seen[0]]
            window.observe(classes[name], t / MS_PER_S)
            seen[0] += 1
        members = fleet.members()
        loads = loads_at(workload, window.rates(now_s))
        d = decide(loads, members, workload.models, damper, now_s,
                   horizon_s=knobs["horizon"] / c, gpu_mb=fleet.template.gpu_mem_mb,
                   max_util=knobs["max_util"], headroom=knobs["headroom"],
                   by_level=knobs["levels"] > 0)
        if log is not None:
            log.append(reading(now_s, loads, members, d))
        for hint in d.add:
            fleet.add(() if part == "no-hints" else hint)
        for name in (fleet.newest(len(d.remove)) if part == "newest" else d.remove):
            fleet.drain(name)

    return tick


def keda_queue(c: float, list_length: float = KEDA_LIST_LENGTH) -> Tick:
    """KEDA's Redis-lists scaler on tasks queued or running, ``list_length`` per worker."""
    damper = Damper(KEDA_DOWN_S / c)

    def tick(fleet: Fleet, now_s: float) -> None:
        want = damper.step(now_s, max(1, math.ceil(messages(fleet) / list_length)))
        _resize(fleet, want)

    return tick


def ray_ongoing(c: float, target: float = RAY_TARGET) -> Tick:
    """Ray Serve's target ongoing requests (``target`` per replica) with its two delays."""
    since = {"up": -1.0, "down": -1.0}

    def tick(fleet: Fleet, now_s: float) -> None:
        have = len(fleet.ready()) + len(fleet.starting)
        want = max(1, math.ceil(messages(fleet) / target))
        for way, on, delay in (("up", want > have, RAY_UP_S), ("down", want < have, RAY_DOWN_S)):
            if not on:
                since[way] = -1.0
                continue
            if since[way] < 0:
                since[way] = now_s
            if now_s - since[way] >= delay / c:
                since[way] = -1.0
                _resize(fleet, want)

    return tick


def _resize(fleet: Fleet, want: int) -> None:
    """Add cold workers, or drain the newest (the baselines' provider: no hints)."""
    have = len(fleet.ready()) + len(fleet.starting)
    for _ in range(want - have):
        fleet.add()
    if want < have:
        for name in fleet.newest(have - want):
            fleet.drain(name)


def parse(autoscaler: str) -> tuple[str, float | None, str]:
    """``name[:arg]`` -> (name, target, variant): ``keda-queue:N`` and ``ray-ongoing:N``
    set the per-worker target, ``fixed-peak:N`` the fixed fleet (default: what the rule
    asks for at the peak rate), ``compass-plan:no-hints`` and ``compass-plan:newest``
    leave out its preload hints or its choice of the worker to drain, and
    ``compass-plan:headroom=0.9+down=60`` sets its knobs (:data:`PLAN_KNOBS`)."""
    kind, _, arg = autoscaler.partition(":")
    if kind not in AUTOSCALERS:
        raise ValueError(f"autoscaler: expected one of {', '.join(AUTOSCALERS)}, "
                         f"got {autoscaler!r}")
    if not arg:
        return kind, None, ""
    if kind == "compass-plan":
        try:
            plan_knobs(arg)
        except ValueError as exc:
            raise ValueError(f"autoscaler {autoscaler!r}: {exc}") from None
        return kind, None, arg
    try:
        target = float(arg)
    except ValueError:
        raise ValueError(f"autoscaler {autoscaler!r}: the target after ':' must be a "
                         f"number") from None
    if not target > 0 or (kind == "fixed-peak" and not target.is_integer()):
        raise ValueError(f"autoscaler {autoscaler!r}: the target must be > 0 (a whole "
                         f"number of workers for fixed-peak)")
    return kind, target, ""


@dataclass(frozen=True)
class Setup:
    """One comparison's trace and settings."""

    trace: Trace
    cold_start_s: float = COLD_START_S
    poll_s: float = KEDA_POLL_S
    #: Record compass-plan's reading at each tick (the record's ``readings``).
    readings: bool = False


def run(workload: Workload, autoscaler: str, setup: Setup, seed: int = 0,
        make_sim: Callable[..., Simulation] | None = None) -> dict[str, Any]:
    """One autoscaler over the trace: the simulation's record plus ``gpu_hours``
    (trace scale), ``worker_s``, ``cold_starts``, ``workers`` (mean, peak) and
    ``timeline`` ([seconds, workers], each change); with ``setup.readings``,
    compass-plan's per-tick ``readings``."""
    kind, target, variant = parse(autoscaler)
    trace, c = setup.trace, setup.trace.compression
    times = trace.times_ms(seed)
    stream = _stream(workload, times, seed)
    peak = steady_workers(workload, trace.peak_per_s)
    start_rate = trace.rate(0.0)
    fixed = kind == "fixed-peak"
    n0 = (int(target) if target else peak) if fixed else steady_workers(workload, start_rate)
    build = make_sim if make_sim is not None else _simulation
    sim = build(workload, stream, n0, trace.peak_per_s if fixed else start_rate)
    fleet = Fleet(sim, workload.cluster.workers[0], setup.cold_start_s / c * MS_PER_S)
    log: list[dict[str, Any]] | None = [] if setup.readings else None
    tick: Tick | None = {
        "compass-plan": lambda: compass_plan(workload, stream, c, variant,
                                             setup.cold_start_s, log),
        "keda-queue": lambda: keda_queue(c, target or KEDA_LIST_LENGTH),
        "ray-ongoing": lambda: ray_ongoing(c, target or RAY_TARGET),
        "fixed-peak": lambda: None,
    }[kind]()
    poll_ms, end_ms = setup.poll_s / c * MS_PER_S, trace.duration_s * MS_PER_S

    def step() -> None:
        assert tick is not None
        tick(fleet, sim.engine.now / MS_PER_S)
        if sim.engine.now + poll_ms < end_ms:
            sim.engine.after(poll_ms, step)

    if tick is not None:
        sim.engine.at(poll_ms, step)
    jobs = sim.run()
    last = max([end_ms, *(j.end for j in jobs if j.end is not None)])
    fleet.close(last)
    out = summarize(jobs, sim.cluster, 0.0, sim.plan_ns)
    counts = [n for _, n in fleet.timeline]
    out.update({"gpu_hours": round(fleet.billed_ms / MS_PER_S * c / 3600.0, 2),
                "worker_s": round(fleet.billed_ms / MS_PER_S, 1),
                "cold_starts": fleet.cold_starts,
                "workers": {"mean": round(fleet.billed_ms / last, 2),
                            "peak": max(counts)},
                "timeline": [[round(t, 2), n] for t, n in fleet.timeline]})
    if log is not None:
        out["readings"] = log
    return out


def _stream(workload: Workload, times_ms: Sequence[float], seed: int
            ) -> list[tuple[float, str]]:
    """The trace's arrival times, each with a template drawn by the mix (seeded)."""
    rng = random.Random(f"{seed}:mix")
    names, weights = list(workload.mix), list(workload.mix.values())
    return [(t, rng.choices(names, weights)[0]) for t in times_ms]


def _simulation(workload: Workload, stream: Sequence[tuple[float, str]], workers: int,
                rate: float) -> Simulation:
    """The compass simulation the fleet scales: ``workers`` warm for ``rate``."""
    from .options import SimOptions

    return Simulation(workload, "compass", stream,
                      SimOptions(workers=workers, rate=rate, warm=True))


def compare(workload: Workload, traces: Sequence[Trace], autoscalers: Sequence[str] = AUTOSCALERS,
            seed: int = 0, **kw: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Every autoscaler on every trace: trace -> autoscaler -> :func:`run`'s record."""
    return {t.name: {a: run(workload, a, Setup(t, **kw), seed) for a in autoscalers}
            for t in traces}


def table(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """GPU-hours, attainment (all jobs, and admitted), goodput, cold starts and workers
    per trace and autoscaler, with compass-plan's saving against each."""
    head = ["trace", "autoscaler", "GPU-h", "plan saves", "attain", "adm attain", "goodput/s",
            "rejected", "cold starts", "mean wk", "peak wk"]
    rows = [head]
    for trace, by in results.items():
        plan = by.get("compass-plan", {}).get("gpu_hours")
        for name, r in by.items():
            slo = r.get("slo", {}).get("all", {})
            saving = "-" if not plan or name == "compass-plan" else \
                f"{1 - plan / r['gpu_hours']:+.0%}" if r["gpu_hours"] else "-"
            rows.append([trace, name, f"{r['gpu_hours']:.1f}", saving,
                         f"{slo.get('attainment', 0):.4f}",
                         f"{slo.get('admitted_attainment', 0):.4f}",
                         f"{slo.get('goodput_jobs_per_s', 0):.2f}", str(slo.get("rejected", 0)),
                         str(r["cold_starts"]), f"{r['workers']['mean']:.2f}",
                         str(r["workers"]["peak"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip()
                     for row in rows)


#: The comparison's bar. Every row compared must keep this share of its admitted jobs in
#: time; and since admission is shared, a coarse setting can keep it by refusing more, so a
#: baseline row counts only if its share of all jobs in time (refused counting as missed)
#: is not under compass-plan's by more than ``ALL_SLACK``: the saving is then the cost of
#: about the same service, not of refusing more.
MIN_ADMITTED, ALL_SLACK = 0.99, 0.01
#: The baselines compass-plan is compared with, in the summary's order.
BASELINES = ("keda-queue", "fixed-peak")


def _shares(record: Mapping[str, Any]) -> tuple[float, float]:
    """(admitted jobs in time over admitted, jobs in time over all jobs) of a run."""
    slo = record.get("slo", {}).get("all", {})
    return float(slo.get("admitted_attainment", 0.0)), float(slo.get("attainment", 0.0))


def comparator(rows: Mapping[str, Mapping[str, Any]], kind: str, plan: str = "compass-plan",
               min_admitted: float = MIN_ADMITTED, all_slack: float = ALL_SLACK
               ) -> str | None:
    """The ``kind`` row (one autoscaler, any of its settings) ``plan`` is measured against
    on one trace: the cheapest in GPU-hours that keeps ``min_admitted`` of its admitted
    jobs in time and whose share of all jobs in time is at least ``plan``'s less
    ``all_slack``. None: no row qualifies (run a finer setting, or none serves as well)."""
    floor = _shares(rows[plan])[1] - all_slack
    fit = [(r["gpu_hours"], name) for name, r in rows.items()
           if parse(name)[0] == kind and _shares(r)[0] >= min_admitted
           and _shares(r)[1] >= floor - 1e-12]
    return min(fit)[1] if fit else None


def saving(rows: Mapping[str, Mapping[str, Any]], kind: str, plan: str = "compass-plan",
           min_admitted: float = MIN_ADMITTED, all_slack: float = ALL_SLACK
           ) -> dict[str, Any]:
    """``plan``'s saving against :func:`comparator`'s ``kind`` row: ``against`` (the row,
    or None), ``saves`` (1 - plan / row GPU-hours; None without a row or when ``plan``
    itself keeps under ``min_admitted`` of its admitted jobs in time) and ``plan_holds``.
    Without a row (every ``kind`` setting that keeps ``min_admitted`` serves fewer of all
    jobs), ``closest``: the cheapest of those, and ``saves_closest`` against it, a bound
    below what serving as many would save (None when none keeps ``min_admitted``)."""
    holds = _shares(rows[plan])[0] >= min_admitted
    against = comparator(rows, kind, plan, min_admitted, all_slack)
    out: dict[str, Any] = {"against": against, "saves": None, "plan_holds": holds}
    if against is None:
        closest = comparator(rows, kind, plan, min_admitted, all_slack=1.0)
        out.update(closest=closest, saves_closest=None)
        if holds and closest is not None and rows[closest]["gpu_hours"] > 0:
            out["saves_closest"] = 1.0 - rows[plan]["gpu_hours"] / rows[closest]["gpu_hours"]
    elif holds and rows[against]["gpu_hours"] > 0:
        out["saves"] = 1.0 - rows[plan]["gpu_hours"] / rows[against]["gpu_hours"]
    return out


def summary(results: Mapping[str, Mapping[str, Mapping[str, Any]]],
            floors: Mapping[str, float] | None = None) -> str:
    """Per trace and compass-plan row, its saving against each baseline's
    :func:`comparator` row, the rule stated once at the top; given ``floors`` (trace ->
    :func:`floor_gpu_hours`), a line per trace with the most any autoscaler could save
    against each of those rows."""
    lines = [f"saves: 1 - compass-plan / the cheapest row of each baseline that keeps "
             f">= {MIN_ADMITTED:.0%} of its admitted jobs in time and meets at least "
             f"compass-plan's share of all jobs less {ALL_SLACK * 100:g} point (refused "
             f"jobs count as missed); compass-plan must keep {MIN_ADMITTED:.0%} itself"]
    for trace, rows in results.items():
        for plan in (n for n in rows if parse(n)[0] == "compass-plan"):
            adm, everyone = _shares(rows[plan])
            parts = [f"{trace} {plan}: {rows[plan]['gpu_hours']:.1f} GPU-h, adm "
                     f"{adm:.2%}, all {everyone:.2%}"
                     + ("" if adm >= MIN_ADMITTED else f" (under {MIN_ADMITTED:.0%}: "
                        "no saving claimed)")]
            for kind in BASELINES:
                if not any(parse(n)[0] == kind for n in rows):
                    continue
                s = saving(rows, kind, plan)
                if s["against"] is None:
                    parts.append(_unmatched(rows, kind, s))
                    continue
                a_adm, a_all = _shares(rows[s["against"]])
                saves = "-" if s["saves"] is None else f"saves {s['saves']:.1%}"
                parts.append(f"{s['against']} ({rows[s['against']]['gpu_hours']:.1f} GPU-h, "
                             f"adm {a_adm:.2%}, all {a_all:.2%}) {saves}")
            lines.append("; ".join(parts))
        if floors and trace in floors:
            lines.append(_floor_line(trace, rows, floors[trace]))
    return "\n".join(lines)


def _floor_line(trace: str, rows: Mapping[str, Mapping[str, Any]], floor: float) -> str:
    """The summary's words for one trace's :func:`floor_gpu_hours`: the floor, how far
    compass-plan sits above it, and the largest saving the floor leaves against each
    baseline row compass-plan is measured by."""
    parts = [f"{trace} floor: {floor:.1f} GPU-h (an oracle fleet: the rate known, workers "
             f"started instantly, every worker fully busy)"]
    plan = rows.get("compass-plan")
    if plan is not None and floor > 0:
        parts.append(f"compass-plan {plan['gpu_hours'] / floor - 1:+.1%} above it")
    most = []
    for kind in BASELINES:
        if plan is None or not any(parse(n)[0] == kind for n in rows):
            continue
        s = saving(rows, kind)
        row = s["against"] or s.get("closest")
        if row and rows[row]["gpu_hours"] > 0:
            most.append(f"{1 - floor / rows[row]['gpu_hours']:.1%} against {row}")
    if most:
        parts.append("the most any autoscaler could save: " + ", ".join(most))
    return "; ".join(parts)


def _unmatched(rows: Mapping[str, Mapping[str, Any]], kind: str, s: Mapping[str, Any]
               ) -> str:
    """The summary's words when no ``kind`` row serves as well as compass-plan."""
    if s["closest"] is None:
        return f"{kind}: no row keeps {MIN_ADMITTED:.0%} of its admitted jobs in time"
    a_adm, a_all = _shares(rows[s["closest"]])
    saves = "-" if s["saves_closest"] is None else f"saves {s['saves_closest']:.1%}"
    return (f"{kind}: no row serves as well; the cheapest at {MIN_ADMITTED:.0%} of "
            f"admitted, {s['closest']} ({rows[s['closest']]['gpu_hours']:.1f} GPU-h, adm "
            f"{a_adm:.2%}, all {a_all:.2%}) {saves} (a lower bound: it serves fewer)")
