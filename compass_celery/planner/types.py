"""Value objects the planner works on: no I/O, no Celery, no Redis, no torch.

Units everywhere: times in milliseconds (workload time), sizes in MB,
bandwidths in MB/s. These types are the contract between the planner, the
router, the worker side, the benchmark and the simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .batch import BatchSpec, Forming

#: The worker name of a placement on the shared queue (any worker may take it).
SHARED = "*"

# Bandwidths (MB/s) assumed for a worker that does not declare its own. Settings, workload
# files, worker records and the emulated GPU all default to these, so a worker that says
# nothing is costed the same way by the planner, the simulator and the benchmark.
#: Model load from storage to GPU memory.
DEFAULT_LOAD_MB_PER_S = 1500.0
#: Model reload from the host-RAM tier to GPU memory.
DEFAULT_HOST_LOAD_MB_PER_S = 12000.0
#: Task inputs moved between workers.
DEFAULT_NET_MB_PER_S = 1000.0


class PlanningError(ValueError):
    """A plan cannot be made (no live worker can hold a model, bad input)."""


@dataclass(frozen=True)
class ModelDemand:
    """Recent demand for one model across the cluster: GPU ms asked per second (1000 =
    one speed-1.0 worker busy) and tasks per second (see ``planner.demand``), and the
    part of those tasks per second that jobs with a deadline asked for (``urgent_per_s``:
    the demand whose copies batch loads must not evict, ``planner.evict``)."""

    ms_per_s: float
    per_s: float
    urgent_per_s: float = 0.0


@dataclass(frozen=True)
class WorkerView:
    """One worker as the planner sees it: a decoded, validated state record."""

    name: str
    queue: str
    gpu_total_mb: float
    gpu_free_mb: float
    resident: frozenset[str] = frozenset()
    host_resident: frozenset[str] = frozenset()
    backlog_ms: float = 0.0
    speed: float = 1.0
    load_mb_per_s: float = DEFAULT_LOAD_MB_PER_S
    host_load_mb_per_s: float = DEFAULT_HOST_LOAD_MB_PER_S
    net_mb_per_s: float = DEFAULT_NET_MB_PER_S
    heartbeat: float = 0.0
    device: str = "cpu"
    # What each task costs this worker beyond its run, in ms: from one task's end to the
    # next queued one's start (result store, ack, the next message's fetch), learned from
    # measured gaps (``worker.hop``). Every task's start on it is this much later.
    hop_ms: float = 0.0
    # Work planned onto this worker but not yet sent (successors waiting for
    # inputs), in ms. Counted by compass so concurrent jobs do not stack.
    pending_ms: float = 0.0
    # The part of ``pending_ms`` planned at each priority level (0..9): a task of priority
    # p counts only what is planned at p or above (``planner.priority.for_priority``).
    pending_queued_ms: Mapping[int, float] = field(default_factory=dict, hash=False)
    # The demand this worker served lately, per model (``planner.demand``): the
    # cluster's demand is the sum over live workers (``demand.cluster_demand``).
    # Validated where records are decoded; left out of the hash (a dict is unhashable).
    served: Mapping[str, ModelDemand] = field(default_factory=dict, hash=False)
    # Work routed here and not started yet, in ms per priority level (0..9): a task of
    # priority p overtakes what waits below p (``planner.priority.ahead_ms``).
    queued_ms: Mapping[int, float] = field(default_factory=dict, hash=False)
    # Batches forming in this worker's queue (``planner.batch``), by ``batch_key(task,
    # model)``: a batchable task placed here joins one that has room. Empty: none.
    forming: Mapping[str, Forming] = field(default_factory=dict, hash=False)
    # Inputs of batched tasks routed here and not started yet, by batch key: what a real
    # worker's counters say (the planner reads the forming batch from it,
    # ``batch.forming_from_count``). Empty: none.
    queued_inputs: Mapping[str, int] = field(default_factory=dict, hash=False)
    # Models being loaded here now: model -> (when the load began, when it should end), on
    # the clock of ``ClusterView.now``. Their memory is already taken (not in
    # ``gpu_free_mb``); a plan counts only what is left of the load
    # (``cost.in_flight_ms``), so a second task for the model waits for this load instead
    # of loading it a second time elsewhere. Empty: none.
    loading: Mapping[str, tuple[float, float]] = field(default_factory=dict, hash=False)
    # Tasks running here now, each (when it began, when it should end, its charge in ms)
    # on the clock of ``ClusterView.now``: ``backlog_ms`` holds their whole charges until
    # they end; a plan counts only what is left of each (``cost.backlog_left_ms``), not
    # a task half done as if it had just started. Empty: none (or none told).
    running: tuple[tuple[float, float, float], ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    """One DAG node as the planner needs it."""

    name: str
    model: str | None = None
    exec_ms: float = 10.0
    output_kb: float = 0.0
    #: ``compass_batch``: the worker runs it with queued inputs of the same task and model
    #: (``planner.batch``); None: one at a time, as before.
    batch: BatchSpec | None = None


@dataclass(frozen=True)
class DagSpec:
    """A validated DAG: nodes by name and edges (pred, succ).

    Construction does not validate; use :func:`compass_celery.jobs.dag.validate_spec`
    or build through :class:`compass_celery.jobs.dag.Dag` for checked input.
    """

    nodes: Mapping[str, TaskSpec]
    edges: tuple[tuple[str, str], ...] = ()
    name: str = "dag"

    def preds(self, node: str) -> list[str]:
        """The node's predecessors in edge order (O(edges); cache it in hot loops)."""
        return [a for a, b in self.edges if b == node]

    def succs(self, node: str) -> list[str]:
        """The node's successors in edge order (O(edges); cache it in hot loops)."""
        return [b for a, b in self.edges if a == node]

    def sources(self) -> list[str]:
        """Nodes with no predecessor: sent at submission, nobody else releases them."""
        targets = {b for _, b in self.edges}
        return [n for n in self.nodes if n not in targets]

    def sinks(self) -> list[str]:
        """Nodes with no successor: their outputs are the job's results."""
        origins = {a for a, _ in self.edges}
        return [n for n in self.nodes if n not in origins]

    def successor_lists(self) -> dict[str, list[str]]:
        """Successors of every node in edge order, in one pass over the edges."""
        succs: dict[str, list[str]] = {n: [] for n in self.nodes}
        for a, b in self.edges:
            succs[a].append(b)
        return succs

    def topological_order(self) -> list[str]:
        """Kahn's algorithm in O(V + E), ties broken by node declaration order."""
        succs = self.successor_lists()
        indeg = dict.fromkeys(self.nodes, 0)
        for _, b in self.edges:
            indeg[b] += 1
        ready = deque(n for n, d in indeg.items() if d == 0)
        order: list[str] = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for s in succs[n]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
        if len(order) != len(self.nodes):
            stuck = sorted(n for n, d in indeg.items() if d > 0)
            raise PlanningError(f"DAG {self.name!r} has a cycle through {stuck}")
        return order

    @classmethod
    def single(cls, task: TaskSpec) -> DagSpec:
        """A plain (non-DAG) task planned as a one-node DAG."""
        return cls(nodes={task.name: task}, edges=(), name=task.name)


@dataclass(frozen=True)
class ClusterView:
    """A consistent snapshot of the live workers plus the model catalogue.

    ``demand`` (model -> :class:`ModelDemand`) is optional: when present, compass keeps
    enough replicas of each busy model resident (``planner.evict``); when empty, it
    plans exactly as without it.
    """

    workers: tuple[WorkerView, ...]
    model_sizes_mb: Mapping[str, float] = field(default_factory=dict)
    now: float = 0.0
    demand: Mapping[str, ModelDemand] = field(default_factory=dict)
    #: Learned load time per model (ms, storage to device), from measured loads; a model
    #: not in it is estimated as its size over the worker's load bandwidth.
    load_ms: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, workers: Iterable[WorkerView], model_sizes_mb: Mapping[str, float], now: float = 0.0,
        demand: Mapping[str, ModelDemand] | None = None,
        load_ms: Mapping[str, float] | None = None,
    ) -> ClusterView:
        """A snapshot with workers sorted by name, so equal states give equal views."""
        return cls(tuple(sorted(workers, key=lambda w: w.name)), dict(model_sizes_mb), now,
                   dict(demand or {}), dict(load_ms or {}))


@dataclass(frozen=True)
class Placement:
    """Where one task is planned to run, and the estimate behind the choice."""

    task: str
    worker: str
    queue: str
    start_ms: float
    finish_ms: float
    wait_ms: float = 0.0
    load_ms: float = 0.0
    transfer_ms: float = 0.0
    run_ms: float = 0.0
    reason: str = ""
    #: What it adds to its worker's queue when that is not its run time: joining a
    #: forming batch, one input's share of it. None: its run time.
    charge_ms: float | None = None
    #: The part of its model load made while it waits (the worker prefetches into free
    #: memory): not in ``load_ms``, which is only what delays its start.
    prefetch_ms: float = 0.0
    #: Its worker's per-task dispatch (``WorkerView.hop_ms``), in ``wait_ms`` and before
    #: ``start_ms``: with its run, what it adds to its worker's queue.
    hop_ms: float = 0.0


@dataclass(frozen=True)
class Plan:
    """A placement per task, keyed by node name, plus the policy that made it."""

    policy: str
    placements: Mapping[str, Placement]

    @property
    def makespan_ms(self) -> float:
        """Estimated finish of the plan's last task, ms from the snapshot."""
        return max((p.finish_ms for p in self.placements.values()), default=0.0)

    def worker_of(self, task: str) -> str:
        """The worker ``task`` is placed on."""
        return self.placements[task].worker
