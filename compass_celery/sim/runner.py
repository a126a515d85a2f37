"""Replay a workload's job stream on a simulated cluster under each policy, side by side.

Semantics follow the real system: a job is planned at arrival by the policy against
the cluster's current snapshot; only its sources are sent then, and the rest are
recorded as pending work on their planned workers (``planner.pending``, as the real
runtime does). When a task finishes, each successor whose inputs are all done is
re-placed by ``planner.adjust.choose_successor``, the runtime's own decision, and sent.
Results use the benchmark's JSON shape.

Admission and shedding are the real submit's and worker's, through the same functions
(``planner.admission``): a job whose template has an SLO is judged on its plan at
arrival (refused: nothing is sent), each node of a job that sheds carries its latest
start (deadline less its planned time to the job's end), a worker drops a node it would
start later than that and the job's queued tasks are revoked, and a finishing node whose
released successors could no longer meet the deadline sheds the job instead of sending
them. Times are workload ms (time scale 1).

Priorities (``planner.priority``): a job's nodes take its SLO class's priority level (none:
the lowest), as the router gives them. A job is planned, and a released successor
re-placed, on the workers as a task of its level sees them (``for_priority``: only
work in flight and queued at its level or above is ahead of it); workers serve their
queues by level with ageing (``worker.core``, ``compass_priority_age_s``'s default).

Batching (``planner.batch``): nodes a workload marks ``batch`` are run by a worker with
queued tasks of the same node and model as one pass. ``batching="on"`` (the default)
has workers publish their forming batches and compass place by them; ``"blind"`` has
workers batch on their own while the planner sees what today's workers publish; ``"off"``
runs every task alone. A workload without ``batch`` runs the same under all three.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..planner import EXPIRES, VARIANTS, PlanningError, Policy, get_policy
from ..planner.adjust import choose_successor
from ..planner.admission import (
    Slo,
    error_step_ms,
    job_finish_ms,
    job_load_ms,
    job_missing,
    job_wait_ms,
    judge,
    plan_budget_ms,
    plan_error_step,
    should_shed,
    tails_ms,
)
from ..planner.compass import plan_job
from ..planner.cost import MS_PER_S
from ..planner.demand import DemandTracker
from ..planner.evict import eviction_rank
from ..planner.fold import fold_plan
from ..planner.pending import pending_work, send_charge_ms
from ..planner.priority import DEFAULT_PRIORITY, for_priority, resolve_priority
from ..planner.static import NAME as STATIC
from ..planner.static import (
    ReplicaAssignment,
    StaticReplicaPolicy,
    assign_replicas,
    expected_demand,
)
from ..planner.types import ClusterView, DagSpec, Placement
from ..workload import Workload, job_stream
from .cluster import SimCluster, SimTask, SimWorker
from .engine import Engine
from .hops import MeasuredHops, spread_of
from .options import BATCHING, MOVE_FACTOR, PRIORITY_AGE_S, SimOptions  # noqa: F401 (re-exported)
from .stats import summarize

#: Policies only the simulator can run (references, not in ``planner.POLICIES``):
#: ``static-replicas`` (``planner.static``) needs its assignment, built per run here.
SIM_ONLY_POLICIES = (STATIC,)


@dataclass(eq=False)
class Job:
    """One job in flight: its plan and which of its tasks are done where."""

    index: int
    dag: DagSpec
    arrival: float
    planned: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    # per node: its run, workload ms (its share of a batched pass): the window batch share
    run_ms: dict[str, float] = field(default_factory=dict)
    pending: dict[str, tuple[str, float]] = field(default_factory=dict)  # charged, not sent
    end: float | None = None
    failed: bool = False
    # Its SLO (None: no deadline), when its answer is due (workload ms; None: never) and
    # each node's planned time to the job's end (only when the job sheds).
    slo: Slo | None = None
    due: float | None = None
    tails: dict[str, float] = field(default_factory=dict)
    plan_end: float | None = None  # when its plan said it would end (workload ms)
    predicted_ms: float | None = None  # its plan's finish, ms after arrival (any job)
    rejected: bool = False  # refused at arrival: nothing was sent (end = arrival)
    refused_for: str = ""  # why (``Verdict.cause``: deadline, queue_full, cold)
    shed: bool = False  # dropped once it could no longer meet its deadline (end = then)
    late: bool = False  # admitted although predicted to miss its deadline
    tasks: list[SimTask] = field(default_factory=list)  # sent, kept to revoke (sheds only)
    # Sums over finished tasks, workload ms: queued, load, hop, run; and the task count.
    parts: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    #: Per task run in a batched pass: ms it waited while its batch was held open.
    held: list[float] = field(default_factory=list)
    #: Its nodes' priority level (its SLO class's; 9 most urgent).
    level: int = DEFAULT_PRIORITY


class Simulation:
    """One policy on one cluster over one job stream, under ``options``
    (:class:`~compass_celery.sim.options.SimOptions`, with ``changes`` applied by name).

    ``rate`` (jobs per second; default the workload's) sizes ``static-replicas``'
    assignment (``planner.static``), which is preloaded and pinned before the first job;
    ``assignment`` holds it (None under every other policy).

    ``admission``, ``max_queue_ms`` and ``headroom`` are the runtime's
    ``compass_admission``, ``compass_max_queue_ms`` and ``compass_admission_headroom``:
    with admission off, a job predicted to miss its deadline is taken, marked late (it
    still sheds once it falls behind, as on the real cluster). ``warm`` starts every
    worker with the models ``static-replicas`` would give it resident (unpinned): a
    cluster that has been serving, rather than one just started.
    """

    def __init__(self, workload: Workload, policy: str, stream: Sequence[tuple[float, str]],
                 options: SimOptions | None = None, **changes: Any) -> None:
        self.options = o = SimOptions.of(options, changes)
        workers, count_pending, rate, warm = o.workers, o.count_pending, o.rate, o.warm
        self.batching = o.batching
        specs = workload.cluster.workers if workers is None else \
            workload.cluster.scaled(workers).workers
        self.assignment: ReplicaAssignment | None = None
        replicas: ReplicaAssignment | None = None
        if policy == STATIC or warm:
            wanted = expected_demand(workload.dags, workload.mix,
                                     workload.arrivals.rate_per_s if rate is None else rate)
            replicas = assign_replicas(wanted, workload.models,
                                       {s.name: s.gpu_mem_mb for s in specs})
        if policy == STATIC and replicas is not None:
            self.assignment = replicas
            self.policy: Policy = StaticReplicaPolicy(replicas, count_pending)
        else:
            opts = {"count_pending": count_pending} if policy == "compass" else {}
            self.policy = get_policy(VARIANTS.get(policy, policy), seed=workload.seed, **opts)
        #: Celery's ``expires=`` at each job's arrival plus its deadline on every task
        self.expires = policy == EXPIRES
        self.adjusts = self.policy.adjusts
        self.admission, self.max_queue_ms = o.admission, o.max_queue_ms
        self.headroom = o.headroom
        self.slos = {name: workload.slo(name) for name in workload.dags}
        self.models = {name: {n: t.model for n, t in dag.nodes.items()}
                       for name, dag in workload.dags.items()}
        # each template's level, as the router resolves a job's class's priority
        self.levels = {name: resolve_priority(slo.priority if slo is not None else None)
                       for name, slo in self.slos.items()}
        self.move_factor = o.move_factor
        self.workload, self.stream = workload, stream
        self.engine = Engine()
        # The producer's view of recent demand per model (planner.demand), fed with every
        # arriving job; the snapshot hands it to the planner. Off: plans as without it.
        self.demand = DemandTracker() if o.demand else None
        self.cluster = SimCluster(specs, self.engine, workload.models,
                                  shared=self.policy.shared,
                                  on_done=self._done, on_failed=self._failed,
                                  on_shed=self._dropped,
                                  refresh_ms=o.refresh_ms, hop_ms=o.hop_ms,
                                  demand=self.demand, batching=o.batching,
                                  plan_hop=o.plan_hop, measured_hops=o.measured_hops,
                                  seed=workload.seed, age_s=o.priority_age_s,
                                  hold_max_ms=o.hold_max_ms)
        if self.assignment is not None:
            self.cluster.preload(self.assignment.by_worker())
        elif replicas is not None:
            self.cluster.warm(replicas.by_worker())
        # the measured delays of a send and of a job's answer (hops.py), drawn per
        # send and per job; none measured: successors go at their predecessor's end
        delays = o.measured_hops.delays(workload.seed) if o.measured_hops else None
        self.release_ms, self.answer_ms = delays or (None, None)
        self.preds = {n: {t: d.preds(t) for t in d.nodes} for n, d in workload.dags.items()}
        self.succs = {n: {t: d.succs(t) for t in d.nodes} for n, d in workload.dags.items()}
        self.jobs: list[Job] = []
        self.moved = 0
        self.plan_error: dict[str, float] = {}  # SLO class -> learned plan error (ms)
        self.plan_ns: list[int] = []  # wall time of each policy.plan call

    def run(self, until_ms: float = math.inf) -> list[Job]:
        """Run to the end, or up to ``until_ms`` (call again to go on from there)."""
        if not self.jobs:
            for i, (t, name) in enumerate(self.stream):
                job = Job(i, self.workload.dags[name], t, level=self.levels[name])
                self.jobs.append(job)
                self.engine.at(t, self._arrive, job)
        with fewer_collections():
            self.engine.run(until_ms)
        return self.jobs

    def _arrive(self, job: Job) -> None:
        dag = job.dag
        slo = self.slos[dag.name]
        if self.demand is not None:  # refused or not; read at the next rebuild
            self.demand.observe(dag, self.engine.now / MS_PER_S,
                                urgent=slo is not None and slo.deadline_ms is not None)
        # as a task of its level sees the workers (the lowest level skips nothing)
        snapshot = self.cluster.snapshot() if job.level <= DEFAULT_PRIORITY \
            else self.cluster.leveled(job.level)
        started = time.perf_counter_ns()
        try:
            plan = plan_job(self.policy, dag, snapshot, plan_budget_ms(
                slo, self.headroom, self.plan_error.get(slo.name, 0.0) if slo else 0.0))
        except PlanningError:
            job.failed = True
            return
        finally:
            self.plan_ns.append(time.perf_counter_ns() - started)
        if not self._admit(job, plan.placements, snapshot):
            return
        job.predicted_ms = job_finish_ms(plan.placements)
        preds = self.preds[dag.name]
        for node, placement in plan.placements.items():
            job.planned[node] = placement.worker
            job.waiting[node] = len(preds[node])
        job.pending = pending_work(plan.placements, preds)
        if self.cluster.refresh_ms > 0:  # planned on a stale view: fold the plan into it
            self._fold(job, plan.placements)
        for worker, ms in job.pending.values():
            self.cluster.by_name[worker].add_pending(ms, job.level)
        for node in dag.nodes:
            if not preds[node]:
                self._release(job, node, job.planned[node])

    def _release(self, job: Job, node: str, target: str | None = None) -> None:
        """Send a node whose inputs are done, after the measured delay of a send when
        one is drawn (the sender's completion, its placement and the send); ``target``
        None: its worker is decided when it goes (``_target``)."""
        if self.release_ms is None:
            self._send(job, node, target if target is not None else self._target(job, node))
            return
        self.engine.after(self.release_ms(), self._released, job, node, target)

    def _released(self, job: Job, node: str, target: str | None) -> None:
        if job.shed or job.failed:  # ended while the send was under way: nothing goes
            return
        self._send(job, node, target if target is not None else self._target(job, node))

    def _fold(self, job: Job, placements: Mapping[str, Placement]) -> None:
        """Fold a plan made on a stale view (``refresh_ms``) into that view, as the
        router's reader folds its own decisions (``planner.fold``): each task's charge (a
        sent source's to its worker's backlog, a waiting successor's to its planned work)
        and each model load it plans, with what the load evicts. A fresh view needs none:
        the next plan re-reads the rows the plan changed."""
        base = self.cluster.last_snapshot()
        preds = self.preds[job.dag.name]
        charges = {node: (p.charge_ms if p.charge_ms is not None and not preds[node]
                          else send_charge_ms(p.run_ms, p.hop_ms), bool(preds[node]), job.level)
                   for node, p in placements.items()}
        self.cluster.fold(fold_plan(base, job.dag.nodes, placements, eviction_rank(base),
                                    charges))

    def _admit(self, job: Job, placements: dict[str, Any], snapshot: ClusterView) -> bool:
        """Judge the job's plan as the real submit does (``planner.admission.judge`` on
        its predicted finish and wait, its cold loads and its class's learned plan
        error); a refused job ends at arrival with nothing sent. A taken job with a
        deadline gets its due time, its planned end and, when it sheds, its tails."""
        slo = job.slo = self.slos[job.dag.name]
        if slo is None and self.max_queue_ms is None:
            return True  # judge would take it, unmarked: skip the two passes over the plan
        verdict = judge(slo, job_finish_ms(placements), job_wait_ms(placements),
                        max_queue_ms=self.max_queue_ms, admission=self.admission,
                        load_ms=job_load_ms(placements),
                        missing=job_missing(placements, self.models[job.dag.name], snapshot),
                        headroom=self.headroom,
                        error_ms=self.plan_error.get(slo.name, 0.0) if slo else 0.0)
        if not verdict.admitted:
            job.rejected, job.end = True, job.arrival
            job.refused_for = verdict.cause
            return False
        job.late = verdict.late
        if slo is not None and slo.deadline_ms is not None:
            job.due = job.arrival + slo.deadline_ms
            job.plan_end = job.arrival + job_finish_ms(placements)
            if self.expires:  # each task dropped unrun once its job's deadline has passed
                job.tails = dict.fromkeys(placements, 0.0)
            elif slo.sheds and verdict.sheds:
                job.tails = tails_ms(placements)
        return True

    def _send(self, job: Job, node: str, target: str) -> None:
        spec = job.dag.nodes[node]
        preds = self.preds[job.dag.name][node]
        charged = job.pending.pop(node, None)
        if charged is not None:
            self.cluster.by_name[charged[0]].add_pending(-charged[1], job.level)
        inputs = [(job.where[p], job.dag.nodes[p].output_kb) for p in preds]
        task = SimTask(job, node, spec.model, spec.exec_ms, inputs,
                       batch=spec.batch if self.batching != "off" else None, level=job.level,
                       later=bool(preds) and job.due is not None)
        tail = job.tails.get(node)
        if tail is not None and job.due is not None:
            task.due_s, task.tail_ms = job.due / MS_PER_S, tail
            job.tasks.append(task)
        self.cluster.send(task, target)

    def _done(self, task: SimTask, worker: SimWorker) -> None:
        job, now = task.job, self.engine.now
        job.finish[task.node] = now
        job.where[task.node] = worker.name
        job.run_ms[task.node] = task.expected_ms / max(1, task.batch_size)
        load = task.model_at - task.turn_at
        parts = job.parts
        parts[0] += task.start_at - task.sent_at - load
        parts[1] += load
        parts[2] += task.hop_ms
        parts[3] += task.expected_ms
        parts[4] += 1
        if task.batch_size:
            job.held.append(task.held_ms)
        if job.failed or job.shed:
            return
        if len(job.finish) == len(job.dag.nodes):
            # its sender has the answer once it is delivered (a measured delay, if drawn)
            job.end = now + (self.answer_ms() if self.answer_ms is not None else 0.0)
            self._learn(job, now)
        released = []
        for succ in self.succs[job.dag.name][task.node]:
            job.waiting[succ] -= 1
            if job.waiting[succ] == 0:
                released.append(succ)
        if job.due is not None and any(
                s in job.tails and should_shed(now / MS_PER_S, job.due / MS_PER_S, job.tails[s])
                for s in released):
            self.cluster.withheld += len(released)
            # the runtime's _too_late: fail the job instead of sending
            self._shed(job, max(job.tails.get(s, 0.0) for s in released))
            return
        for succ in released:
            self._release(job, succ)

    def _target(self, job: Job, node: str) -> str:
        """The worker a released successor goes to: the runtime's adjustment decision."""
        planned = job.planned[node]
        preds = self.preds[job.dag.name][node]
        inputs: dict[str, float] = {}
        for p in preds:
            inputs[job.where[p]] = inputs.get(job.where[p], 0.0) + job.dag.nodes[p].output_kb
        worker = self.cluster.by_name.get(planned)
        level = job.level
        # a retired (draining) worker is out of the snapshot: the successor is re-placed
        record = worker.view() if worker is not None and worker.index >= 0 else None
        snapshot: Callable[[], ClusterView] = self.cluster.snapshot
        if level > DEFAULT_PRIORITY:  # what it would overtake, there and everywhere
            if record is not None:
                record = for_priority((record,), level)[0]
            snapshot = lambda: self.cluster.leveled(level)  # noqa: E731
        moved = choose_successor(job.dag.nodes[node], planned, snapshot, inputs,
                                 factor=self.move_factor, is_join=len(preds) > 1,
                                 adjusts=self.adjusts, planned=record,
                                 now=self.engine.now)
        if moved is None:
            return planned
        self.moved += 1
        return moved.worker

    def _failed(self, task: SimTask, worker: SimWorker) -> None:
        task.job.failed = True

    def _dropped(self, task: SimTask, worker: SimWorker) -> None:
        """A worker dropped a task past its latest start: its job is shed."""
        self._shed(task.job, task.tail_ms or 0.0)

    def _shed(self, job: Job, tail_ms: float = 0.0) -> None:
        """Fail a job that can no longer meet its deadline: its queued tasks are revoked
        unrun and its planned-not-sent work given back (started ones run out)."""
        if job.shed or job.failed:
            return
        job.shed, job.end = True, self.engine.now
        self._learn(job, self.engine.now + tail_ms)  # the end it could at best have had
        for worker, ms in job.pending.values():
            self.cluster.by_name[worker].add_pending(-ms, job.level)
        job.pending.clear()
        self.cluster.revoke(job.tasks)

    def _learn(self, job: Job, end: float) -> None:
        """How late against its plan a job with a deadline ran, folded into its class's
        learned plan error as the runtime's workers do (``plan_error_step``)."""
        if job.plan_end is None or job.slo is None:
            return
        name = job.slo.name
        self.plan_error[name] = plan_error_step(self.plan_error.get(name, 0.0),
                                                end - job.plan_end,
                                                step_ms=error_step_ms(job.slo.deadline_ms))


#: The youngest generation's threshold while a simulation runs (Python's default is 700).
GC_YOUNG_THRESHOLD = 20_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the block with the cyclic collector's youngest generation collected only every
    :data:`GC_YOUNG_THRESHOLD` allocations: a run allocates millions of short-lived
    records and keeps every job, so at the default each collection walked a growing heap
    for almost nothing (4% of a 1,000-worker run). Results do not depend on it."""
    was = gc.get_threshold()
    gc.set_threshold(max(was[0], GC_YOUNG_THRESHOLD), *was[1:])
    try:
        yield
    finally:
        gc.set_threshold(*was)


def simulate(workload: Workload, policies: Sequence[str], options: SimOptions | None = None,
             **changes: Any) -> dict[str, Any]:
    """Every policy on the same cluster and job stream, in the benchmark's result shape.

    ``options`` (:class:`~compass_celery.sim.options.SimOptions`, with ``changes`` applied
    by name) give the cluster, the load and the runtime settings modelled. With
    ``admission`` or ``max_queue_ms``, jobs are judged at arrival as the runtime's
    settings of those names do (jobs whose template has an SLO, or every job under a
    queue bound); the record's ``slo`` section then gives rejected, shed, late,
    attainment and goodput per class, and ``tasks`` what ran and what was dropped unrun.
    ``batching`` (``on``, ``blind``, ``off``; see the module) matters only for workloads
    with batchable nodes; their record then has a ``batching`` section. ``details`` adds
    ``sim_seconds`` (wall time) and ``reassigned`` (successors moved) per policy.
    ``static-replicas`` (simulator only, ``planner.static``) also reports its
    ``assignment`` (model -> workers), ``replica_targets`` and ``replicas_missing``.
    """
    opts = SimOptions.of(options, changes)
    stream = job_stream(workload, rate=opts.rate, jobs=opts.jobs)
    out: dict[str, Any] = {}
    for name in policies:
        started = time.perf_counter()
        sim = Simulation(workload, name, stream, opts)
        finished = sim.run()
        out[name] = summarize(finished, sim.cluster, opts.warmup_frac, sim.plan_ns)
        if sim.assignment is not None:
            out[name].update(sim.assignment.report())
        if opts.details:
            out[name]["sim_seconds"] = round(time.perf_counter() - started, 3)
            out[name]["reassigned"] = sim.moved
    return {"workload": workload.name, "seed": workload.arrivals.seed, "policies": out}


def simulate_draws(workload: Workload, policies: Sequence[str], measured: MeasuredHops,
                   draws: int, options: SimOptions | None = None,
                   **changes: Any) -> dict[str, dict[str, Any]]:
    """:func:`simulate` ``draws`` times, each task's per-task cost drawn from ``measured``
    in an independent stream each time; per policy, the median run and the spread
    (:func:`compass_celery.sim.hops.spread_of`)."""
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    opts = SimOptions.of(options, changes)
    runs = [simulate(workload, policies, replace(opts, measured_hops=replace(measured, draw=k)))
            ["policies"] for k in range(draws)]
    return spread_of(runs)


def compare_count_pending(workload: Workload, options: SimOptions | None = None,
                          **changes: Any) -> dict[str, Any]:
    """Compass with pending (planned-not-sent) work counted in backlog, and without."""
    opts = SimOptions.of(options, changes)
    on = simulate(workload, ["compass"], replace(opts, count_pending=True))
    off = simulate(workload, ["compass"], replace(opts, count_pending=False))
    return {"workload": workload.name, "count_pending": {"on": on["policies"]["compass"],
                                                         "off": off["policies"]["compass"]}}
