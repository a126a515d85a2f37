"""The workload as the real cluster measured it: what the simulator is fed to compare.

After a real-compute run, each model's median run time and the embedder's median load
replace the workload's nominal figures, so the simulator replays the same arrivals on
the costs the CPUs really had. The simulator's loads are size over bandwidth, so the
measured load time of the largest model sets the workers' bandwidth (the small VAD,
loaded once per worker, is then off by its fixed cost; said where it is reported).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..planner.types import DagSpec
from ..workload import ClusterSpec, Workload
from .terms import LOAD_MS


def medians(rows: Iterable[Mapping[str, Any]], term: str, loads_only: bool = False
            ) -> dict[str, float]:
    """Per model, the median measured ``term`` (``run`` or ``load``) of the rows."""
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.get("model") is None or (loads_only and r["meas_load"] < LOAD_MS):
            continue
        by.setdefault(r["model"], []).append(float(r[f"meas_{term}"]))
    return {m: round(statistics.median(v), 2) for m, v in by.items() if v}


def measured_workload(workload: Workload, rows: list[Mapping[str, Any]]) -> Workload:
    """``workload`` with measured run times per model and the largest loaded model's
    measured load time as every worker's bandwidth."""
    runs, loads = medians(rows, "run"), medians(rows, "load", loads_only=True)
    dags = {name: _with_runs(spec, runs) for name, spec in workload.dags.items()}
    cluster = workload.cluster
    if loads:
        model = max(loads, key=lambda m: workload.models.get(m, 0.0))
        bw = workload.models[model] / (loads[model] / 1000.0)
        cluster = ClusterSpec(tuple(replace(w, load_mb_per_s=round(bw, 1))
                                    for w in cluster.workers))
    return replace(workload, dags=dags, cluster=cluster,
                   description=f"{workload.description} (measured: runs {runs}, loads {loads})")


def _with_runs(spec: DagSpec, runs: Mapping[str, float]) -> DagSpec:
    nodes = {n: replace(t, exec_ms=runs.get(t.model, t.exec_ms) if t.model else t.exec_ms)
             for n, t in spec.nodes.items()}
    return replace(spec, nodes=nodes)
