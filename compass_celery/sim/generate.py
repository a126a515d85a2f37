"""Generate many-model workloads at a chosen utilisation, for real-against-simulated checks.

``compass-celery sim generate --seed 7 --models 9 --workflows 4 --load 0.8
--out dags/generated-9m-s7.json`` writes a workload in the ``dags/`` format: ``models``
of 0.8 to 5.7 GB (log-uniform, as the Compass paper's testbed), ``workflows`` DAG
templates of 2 to 5 tasks (each task after the first takes one or two earlier tasks as
inputs, so chains, fan-outs and joins all occur), run times log-uniform from 1 to
800 ms, a random mix, five 14 GB GPUs, and a Poisson rate that keeps the cluster at
``load`` of its GPU time (work per job x rate / workers). Pure and seeded: the same
arguments give the same file, so a generated workload is reproducible from its command.
"""

from __future__ import annotations

import math
import random
from typing import Any

#: Model sizes (MB) and run times (ms) are drawn log-uniformly between these.
SIZE_MB = (800.0, 5700.0)
EXEC_MS = (1.0, 800.0)
#: The cluster every generated workload runs on (as ``dags/multi-model.json``).
CLUSTER = {"workers": 5, "gpu_mem_mb": 14336, "load_mb_per_s": 12000, "net_mb_per_s": 1000}


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _template(rng: random.Random, models: list[str]) -> dict[str, Any]:
    """One DAG template: 2 to 5 tasks, each after the first fed by one or two earlier ones."""
    n = rng.randint(2, 5)
    nodes = {f"t{i}": {"model": rng.choice(models),
                       "exec_ms": round(_log_uniform(rng, *EXEC_MS), 1),
                       "output_kb": rng.choice([1, 2, 4, 20, 60, 200])} for i in range(n)}
    edges = []
    for i in range(1, n):
        for p in sorted(rng.sample(range(i), min(i, rng.choice([1, 1, 2])))):
            edges.append([f"t{p}", f"t{i}"])
    return {"nodes": nodes, "edges": edges}


def work_per_job_ms(dags: dict[str, Any], mix: dict[str, float]) -> float:
    """Expected GPU ms per job under ``mix`` (weights normalised)."""
    total = sum(mix.values())
    return sum(w / total * sum(n["exec_ms"] for n in dags[d]["nodes"].values())
               for d, w in mix.items())


def generate(seed: int, *, models: int = 9, workflows: int = 4, load: float = 0.8,
             jobs: int = 1000) -> dict[str, Any]:
    """A workload object (the ``dags/`` JSON format) at ``load`` utilisation."""
    if models < 1 or workflows < 1 or not 0 < load < 1:
        raise ValueError("need models >= 1, workflows >= 1 and 0 < load < 1")
    rng = random.Random(seed)
    names = [f"m{i}" for i in range(models)]
    sizes = {m: {"size_mb": round(_log_uniform(rng, *SIZE_MB))} for m in names}
    dags: dict[str, Any] = {}
    while len(dags) < workflows:
        dag = _template(rng, names)
        dags[f"wf{len(dags)}"] = dag
    mix = {d: round(rng.uniform(0.1, 1.0), 3) for d in dags}
    work = work_per_job_ms(dags, mix)
    rate = round(load * CLUSTER["workers"] * 1000.0 / work, 3)
    used = sorted({n["model"] for d in dags.values() for n in d["nodes"].values()})
    return {
        "name": f"generated-{models}m-{workflows}w-s{seed}",
        "description": (f"Generated (compass-celery sim generate --seed {seed} "
                        f"--models {models} --workflows {workflows} --load {load}): "
                        f"{workflows} workflows over {len(used)} of {models} models, "
                        f"{work:.1f} GPU ms per job, {rate} jobs/s is about {load:.0%} of "
                        f"five 14 GB GPUs."),
        "models": sizes, "dags": dags, "mix": mix, "cluster": dict(CLUSTER),
        "arrivals": {"process": "poisson", "rate_per_s": rate, "jobs": jobs, "seed": seed},
    }
