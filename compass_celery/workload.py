"""Workload files: parse, validate, and turn into a seeded stream of job arrivals.

A workload names models (MB), DAG templates, a job mix, a cluster and an
arrival process (see dags/README.md). The benchmark and the simulator both
read workloads through here, so a malformed file is rejected once, with a
message naming the bad field by path (``cluster.gpu_mem_mb: ...``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from .dag_validation import DagValidationError, dag_from_dict, describe, name_ok, number
from .errors import CompassInputError
from .planner.admission import DEFAULT_SLO_CLASSES, Slo, SloError, resolve_slo, slo_class
from .planner.batch import BatchError, batch_spec
from .planner.types import (
    DEFAULT_HOST_LOAD_MB_PER_S,
    DEFAULT_LOAD_MB_PER_S,
    DEFAULT_NET_MB_PER_S,
    DagSpec,
)

MAX_MODELS = 10_000
MAX_DAGS = 1_000
MAX_WORKERS = 100_000
MAX_JOBS = 10_000_000
TOP_FIELDS = ("name", "description", "models", "dags", "mix", "cluster", "arrivals", "seed",
              "slo")
WORKER_FIELDS = ("name", "count", "gpu_mem_mb", "load_mb_per_s", "net_mb_per_s", "speed",
                 "host_load_mb_per_s", "host_mem_mb")
ARRIVAL_FIELDS = ("process", "rate_per_s", "jobs", "seed", "on_s", "off_s", "times_ms")
DEFAULTS = {"load_mb_per_s": DEFAULT_LOAD_MB_PER_S, "net_mb_per_s": DEFAULT_NET_MB_PER_S,
            "speed": 1.0, "host_load_mb_per_s": DEFAULT_HOST_LOAD_MB_PER_S}


class WorkloadError(CompassInputError):
    """A workload file is malformed; the message names the bad field by path."""


# The DAG validator's field checks, raising WorkloadError directly (no catch and re-raise).
_num = partial(number, error=WorkloadError)
_name = partial(name_ok, error=WorkloadError)


@dataclass(frozen=True)
class WorkerSpec:
    """One (simulated or emulated) GPU worker: memory in MB, bandwidths in MB/s."""

    name: str
    gpu_mem_mb: float
    load_mb_per_s: float = DEFAULT_LOAD_MB_PER_S
    net_mb_per_s: float = DEFAULT_NET_MB_PER_S
    speed: float = 1.0
    host_load_mb_per_s: float = DEFAULT_HOST_LOAD_MB_PER_S
    # Host-RAM tier for evicted models (reloaded at host_load_mb_per_s); 0 = none, so
    # every load costs size / load_mb_per_s, as in the paper's setup.
    host_mem_mb: float = 0.0


@dataclass(frozen=True)
class ClusterSpec:
    """The workers a workload runs on; heterogeneous when the specs differ."""

    workers: tuple[WorkerSpec, ...]

    @property
    def largest_gpu_mb(self) -> float:
        """The biggest GPU in the cluster: a model larger than this can never run."""
        return max(w.gpu_mem_mb for w in self.workers)

    def scaled(self, n: int) -> ClusterSpec:
        """``n`` workers, repeating the declared specs in order (for ``--workers N``)."""
        if n < 1:
            raise WorkloadError(f"workers: must be at least 1, got {n}")
        width = max(3, len(str(n - 1)))
        return ClusterSpec(tuple(replace(self.workers[i % len(self.workers)],
                                         name=f"w{i:0{width}d}") for i in range(n)))


@dataclass(frozen=True)
class ArrivalSpec:
    """How jobs arrive: Poisson at ``rate_per_s``, bursty on/off, or explicit times."""

    process: str
    rate_per_s: float
    jobs: int
    seed: int = 0
    on_s: float = 0.0
    off_s: float = 0.0
    times_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class Workload:
    """A parsed, validated workload: everything the benchmark and simulator need."""

    name: str
    description: str
    models: dict[str, float]
    dags: dict[str, DagSpec]
    mix: dict[str, float]
    cluster: ClusterSpec
    arrivals: ArrivalSpec
    seed: int = 0
    #: SLO classes the workload defines (as ``compass_slo_classes``), and the class each
    #: template's jobs are sent with (absent: no deadline).
    slo_classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    dag_slo: dict[str, str] = field(default_factory=dict)

    def slo(self, template: str) -> Slo | None:
        """The :class:`Slo` jobs of ``template`` are sent with (None: no deadline)."""
        name = self.dag_slo.get(template)
        return resolve_slo(name, None, self.slo_classes) if name else None

    def reseeded(self, seed: int) -> Workload:
        """The same workload with another arrival stream: ``seed`` draws both the arrival
        times and the template mix (a rerun on fresh arrivals, e.g. to pool rare events
        such as model loads over several runs)."""
        return replace(self, seed=seed, arrivals=replace(self.arrivals, seed=seed))


def _int(value: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise WorkloadError(f"{path}: expected an integer, got {describe(value)}")
    if not lo <= value <= hi:
        raise WorkloadError(f"{path}: must be between {lo} and {hi}, got {value}")
    return value


def _obj(value: Any, path: str, allowed: tuple[str, ...] | None = None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{path}: expected an object, got {describe(value)}")
    for key in value:
        if allowed is not None and key not in allowed:
            raise WorkloadError(f"{path}: unknown field {describe(key)} "
                                f"(allowed: {', '.join(allowed)})")
    return value


def _models(raw: Any) -> dict[str, float]:
    raw = _obj(raw, "models")
    if not raw:
        raise WorkloadError("models: no models declared")
    if len(raw) > MAX_MODELS:
        raise WorkloadError(f"models: {len(raw)} models, more than {MAX_MODELS}")
    out = {}
    for key, val in raw.items():
        key = _name(key, "models: model name")
        if isinstance(val, Mapping):
            val = _obj(val, f"models.{key}", ("size_mb",))
            if "size_mb" not in val:
                raise WorkloadError(f"models.{key}.size_mb: missing")
            out[key] = _num(val["size_mb"], f"models.{key}.size_mb", positive=True)
        else:
            out[key] = _num(val, f"models.{key}", positive=True)
    return out


def _worker(raw: Mapping[str, Any], path: str, name: str) -> WorkerSpec:
    if "gpu_mem_mb" not in raw:
        raise WorkloadError(f"{path}.gpu_mem_mb: missing")
    vals = {k: _num(raw.get(k, DEFAULTS.get(k)), f"{path}.{k}", positive=True)
            for k in ("gpu_mem_mb", *DEFAULTS)}
    host = _num(raw.get("host_mem_mb", 0.0), f"{path}.host_mem_mb", minimum=0.0)
    return WorkerSpec(name=name, host_mem_mb=host, **vals)


def _cluster(raw: Any) -> ClusterSpec:
    if isinstance(raw, Mapping):
        raw = _obj(raw, "cluster", ("workers", *WORKER_FIELDS[2:]))
        if "workers" not in raw:
            raise WorkloadError("cluster.workers: missing (a worker count)")
        n = _int(raw["workers"], "cluster.workers", 1, MAX_WORKERS)
        return ClusterSpec((_worker(raw, "cluster", "w000"),)).scaled(n)
    if not isinstance(raw, list):
        raise WorkloadError(f"cluster: expected an object or a list of workers, got "
                            f"{describe(raw)}")
    if not raw:
        raise WorkloadError("cluster: no workers")
    specs: list[WorkerSpec] = []
    for i, entry in enumerate(raw):
        path = f"cluster[{i}]"
        entry = _obj(entry, path, WORKER_FIELDS)
        count = _int(entry.get("count", 1), f"{path}.count", 1, MAX_WORKERS)
        name = _name(entry.get("name", f"w{len(specs):03d}"), f"{path}.name")
        base = _worker(entry, path, name)
        specs.extend(replace(base, name=name if count == 1 else f"{name}-{j}")
                     for j in range(count))
        if len(specs) > MAX_WORKERS:
            raise WorkloadError(f"cluster: more than {MAX_WORKERS} workers")
    names = [w.name for w in specs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise WorkloadError(f"cluster: duplicate worker name {dup!r}")
    return ClusterSpec(tuple(specs))


def _arrivals(raw: Any, seed: int) -> ArrivalSpec:
    raw = _obj(raw, "arrivals", ARRIVAL_FIELDS)
    process = raw.get("process", "poisson")
    if process not in ("poisson", "bursty", "explicit"):
        raise WorkloadError(f"arrivals.process: expected 'poisson', 'bursty' or 'explicit', "
                            f"got {describe(process)}")
    seed = _int(raw.get("seed", seed), "arrivals.seed", -(2**63), 2**63)
    if process == "explicit":
        times = raw.get("times_ms")
        if not isinstance(times, list) or not times:
            raise WorkloadError(f"arrivals.times_ms: expected a non-empty list of times, got "
                                f"{describe(times)}")
        if len(times) > MAX_JOBS:
            raise WorkloadError(f"arrivals.times_ms: more than {MAX_JOBS} times")
        ts = tuple(sorted(_num(t, f"arrivals.times_ms[{i}]") for i, t in enumerate(times)))
        jobs = _int(raw.get("jobs", len(ts)), "arrivals.jobs", 1, len(ts))
        span_s = (ts[-1] - ts[0]) / 1000.0
        rate = (len(ts) - 1) / span_s if span_s > 0 else 1.0
        return ArrivalSpec("explicit", rate, jobs, seed, times_ms=ts)
    for key in ("rate_per_s", "jobs"):
        if key not in raw:
            raise WorkloadError(f"arrivals.{key}: missing")
    rate = _num(raw["rate_per_s"], "arrivals.rate_per_s", minimum=1e-6)
    jobs = _int(raw["jobs"], "arrivals.jobs", 1, MAX_JOBS)
    if process == "poisson":
        return ArrivalSpec("poisson", rate, jobs, seed)
    on_off = []
    for key in ("on_s", "off_s"):
        if key not in raw:
            raise WorkloadError(f"arrivals.{key}: missing (bursty arrivals need on_s and off_s)")
        on_off.append(_num(raw[key], f"arrivals.{key}", positive=key == "on_s"))
    return ArrivalSpec("bursty", rate, jobs, seed, on_s=on_off[0], off_s=on_off[1])


def _mix(raw: Any, dags: Mapping[str, DagSpec]) -> dict[str, float]:
    if raw is None:
        return {name: 1.0 / len(dags) for name in dags}
    raw = _obj(raw, "mix")
    if not raw:
        raise WorkloadError("mix: empty")
    weights = {}
    for key, val in raw.items():
        key = _name(key, "mix: DAG name")
        if key not in dags:
            raise WorkloadError(f"mix.{key}: unknown DAG (declared: {', '.join(dags)})")
        weights[key] = _num(val, f"mix.{key}", positive=True)
    total = sum(weights.values())
    if not math.isfinite(total):
        raise WorkloadError("mix: weights too large")
    return {k: v / total for k, v in weights.items()}


def _slo(raw: Any, dags: Mapping[str, DagSpec]) -> tuple[dict[str, dict[str, Any]],
                                                         dict[str, str]]:
    """``slo``: ``{"classes": {name: {deadline_ms, on_miss, priority}}, "dags": {template:
    class}}``; the classes add to the defaults (interactive, batch)."""
    raw = _obj(raw, "slo", ("classes", "dags"))
    classes = dict(_obj(raw.get("classes", {}), "slo.classes"))
    for name, body in classes.items():
        try:
            slo_class(name, body)
        except SloError as exc:
            raise WorkloadError(f"slo.classes.{name}: {exc}") from None
    known = {**DEFAULT_SLO_CLASSES, **classes}
    chosen = {}
    for template, name in _obj(raw.get("dags", {}), "slo.dags").items():
        if template not in dags:
            raise WorkloadError(f"slo.dags.{template}: unknown DAG (declared: "
                                f"{', '.join(dags)})")
        if name not in known:
            raise WorkloadError(f"slo.dags.{template}: unknown SLO class {describe(name)} "
                                f"(known: {', '.join(sorted(known))})")
        chosen[template] = name
    return classes, chosen


def _split_batches(raw: Any) -> tuple[Any, dict[str, Any]]:
    """A template without its nodes' optional ``batch`` fields (the DAG validator does not
    know them), and those fields by node name."""
    nodes = raw.get("nodes") if isinstance(raw, Mapping) else None
    if isinstance(nodes, Mapping):
        entries = list(nodes.items())
    elif isinstance(nodes, list):
        entries = [(e.get("name"), e) for e in nodes if isinstance(e, Mapping)]
    else:
        return raw, {}
    batches = {n: e["batch"] for n, e in entries if isinstance(e, Mapping) and "batch" in e}
    if not batches:
        return raw, {}
    strip = lambda e: {k: v for k, v in e.items() if k != "batch"} \
        if isinstance(e, Mapping) else e  # noqa: E731
    bare = {k: strip(v) for k, v in nodes.items()} if isinstance(nodes, Mapping) \
        else [strip(e) for e in nodes]
    return {**raw, "nodes": bare}, batches


def _with_batches(dag: DagSpec, batches: Mapping[str, Any], path: str) -> DagSpec:
    """``dag`` with each node's ``batch`` (``planner.batch.batch_spec``: max_size,
    max_wait_ms, and base_ms/per_item_ms, base defaulting to the node's exec_ms)."""
    nodes = dict(dag.nodes)
    for node, raw in batches.items():
        try:
            spec = batch_spec(raw, nodes[node].exec_ms)
        except BatchError as exc:
            msg = str(exc)
            where = f"{path}.{node}." if msg.startswith("batch") else f"{path}.{node}.batch: "
            raise WorkloadError(where + msg) from None
        nodes[node] = replace(nodes[node], batch=spec)
    return replace(dag, nodes=nodes)


def parse_workload(obj: Any, name_hint: str = "workload") -> Workload:
    """Validate a decoded workload document; raises only WorkloadError on bad input."""
    obj = _obj(obj, "workload", TOP_FIELDS)
    name = _name(obj.get("name", name_hint), "name")
    description = obj.get("description", "")
    if not isinstance(description, str):
        raise WorkloadError(f"description: expected a string, got {describe(description)}")
    seed = _int(obj.get("seed", 0), "seed", -(2**63), 2**63)
    for key in ("models", "dags", "cluster", "arrivals"):
        if key not in obj:
            raise WorkloadError(f"{key}: missing")
    models = _models(obj["models"])
    cluster = _cluster(obj["cluster"])
    largest = cluster.largest_gpu_mb
    for model, size in models.items():
        if size > largest:
            raise WorkloadError(f"models.{model}: {size:g} MB does not fit on any worker "
                                f"(largest GPU {largest:g} MB)")
    raw_dags = _obj(obj["dags"], "dags")
    if not raw_dags:
        raise WorkloadError("dags: no DAG templates")
    if len(raw_dags) > MAX_DAGS:
        raise WorkloadError(f"dags: more than {MAX_DAGS} templates")
    dags = {}
    for key, val in raw_dags.items():
        key = _name(key, "dags: DAG name")
        val, batches = _split_batches(val)
        try:
            dags[key] = dag_from_dict(key, val, models, max_gpu_mb=largest)
        except DagValidationError as exc:
            # The one place left: a template is checked deep in dag_validation (shared with
            # Dag), and callers catch WorkloadError. The message already names the DAG,
            # node and field (dags.<dag>.nodes.<node>.<field>: ...).
            raise WorkloadError(str(exc)) from exc
        if batches:
            dags[key] = _with_batches(dags[key], batches, f"dags.{key}.nodes")
    arrivals = _arrivals(obj["arrivals"], seed if "seed" in obj else 0)
    if "seed" not in obj:
        seed = arrivals.seed
    slo_classes, dag_slo = _slo(obj.get("slo", {}), dags)
    return Workload(name, description, models, dags, _mix(obj.get("mix"), dags), cluster,
                    arrivals, seed, slo_classes, dag_slo)


def load_workload(path: str | Path) -> Workload:
    """Read a workload file: YAML for ``.yaml``/``.yml``, JSON otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None
    try:
        is_yaml = path.suffix.lower() in (".yaml", ".yml")
        obj = yaml.safe_load(text) if is_yaml else json.loads(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        raise WorkloadError(f"{path}: not valid {'YAML' if is_yaml else 'JSON'}: "
                            f"{str(exc)[:200]}") from None
    return parse_workload(obj, name_hint=path.stem)


def arrival_times_ms(arrivals: ArrivalSpec, *, rate: float | None = None,
                     jobs: int | None = None) -> list[float]:
    """Seeded arrival times in ms; ``rate``/``jobs`` override the file's values."""
    n = arrivals.jobs if jobs is None else _int(jobs, "jobs", 1, MAX_JOBS)
    r = arrivals.rate_per_s if rate is None else _num(rate, "rate", minimum=1e-6)
    if arrivals.process == "explicit":
        if n > len(arrivals.times_ms):
            raise WorkloadError(f"jobs: {n} asked, arrivals.times_ms lists only "
                                f"{len(arrivals.times_ms)}")
        scale = arrivals.rate_per_s / r
        t0 = arrivals.times_ms[0]
        return [t0 + (t - t0) * scale for t in arrivals.times_ms[:n]]
    rng = random.Random(arrivals.seed)
    out, busy_ms = [], 0.0
    on_ms, off_ms = arrivals.on_s * 1000.0, arrivals.off_s * 1000.0
    for _ in range(n):
        busy_ms += rng.expovariate(r) * 1000.0
        if arrivals.process == "bursty":  # fold "on" time onto the wall clock
            out.append(busy_ms // on_ms * (on_ms + off_ms) + busy_ms % on_ms)
        else:
            out.append(busy_ms)
    return out


def job_stream(workload: Workload, *, rate: float | None = None,
               jobs: int | None = None) -> list[tuple[float, str]]:
    """(arrival ms, DAG template name) per job, the template drawn by the mix, seeded."""
    times = arrival_times_ms(workload.arrivals, rate=rate, jobs=jobs)
    rng = random.Random(f"{workload.seed}:mix")
    names, weights = list(workload.mix), list(workload.mix.values())
    return [(t, rng.choices(names, weights)[0]) for t in times]


def lower_bound_ms(dag: DagSpec, workload: Workload) -> float:
    """Critical path on the fastest worker, every model resident, no queueing or transfer."""
    speed = max(w.speed for w in workload.cluster.workers)
    finish: dict[str, float] = {}
    for node in dag.topological_order():
        start = max((finish[p] for p in dag.preds(node)), default=0.0)
        finish[node] = start + dag.nodes[node].exec_ms / speed
    return max(finish.values(), default=0.0)
