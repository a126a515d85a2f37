"""Value objects the planner works on: no I/O, no Celery, no Redis, no torch.

Units everywhere: times in milliseconds (workload time), sizes in MB,
bandwidths in MB/s. These types are the contract between the planner, the
router, the worker side, the benchmark and the simulator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: The worker name of a placement on the shared queue (any worker may take it).
SHARED = "*"


class PlanningError(ValueError):
    """A plan cannot be made (no live worker can hold a model, bad input)."""


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
    load_mb_per_s: float = 1500.0
    host_load_mb_per_s: float = 12000.0
    net_mb_per_s: float = 1000.0
    heartbeat: float = 0.0
    device: str = "cpu"
    # Work planned onto this worker but not yet sent (successors waiting for
    # inputs), in ms. Counted by compass so concurrent jobs do not stack.
    pending_ms: float = 0.0


@dataclass(frozen=True)
class TaskSpec:
    """One DAG node as the planner needs it."""

    name: str
    model: str | None = None
    exec_ms: float = 10.0
    output_kb: float = 0.0


@dataclass(frozen=True)
class DagSpec:
    """A validated DAG: nodes by name and edges (pred, succ).

    Construction does not validate; use :func:`compass_celery.dag.validate_spec`
    or build through :class:`compass_celery.dag.Dag` for checked input.
    """

    nodes: Mapping[str, TaskSpec]
    edges: tuple[tuple[str, str], ...] = ()
    name: str = "dag"

    def preds(self, node: str) -> list[str]:
        return [a for a, b in self.edges if b == node]

    def succs(self, node: str) -> list[str]:
        return [b for a, b in self.edges if a == node]

    def sources(self) -> list[str]:
        targets = {b for _, b in self.edges}
        return [n for n in self.nodes if n not in targets]

    def sinks(self) -> list[str]:
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
    """A consistent snapshot of the live workers plus the model catalogue."""

    workers: tuple[WorkerView, ...]
    model_sizes_mb: Mapping[str, float] = field(default_factory=dict)
    now: float = 0.0

    @classmethod
    def of(
        cls, workers: Iterable[WorkerView], model_sizes_mb: Mapping[str, float], now: float = 0.0
    ) -> ClusterView:
        return cls(tuple(sorted(workers, key=lambda w: w.name)), dict(model_sizes_mb), now)


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


@dataclass(frozen=True)
class Plan:
    """A placement per task, keyed by node name, plus the policy that made it."""

    policy: str
    placements: Mapping[str, Placement]

    @property
    def makespan_ms(self) -> float:
        return max((p.finish_ms for p in self.placements.values()), default=0.0)

    def worker_of(self, task: str) -> str:
        return self.placements[task].worker
