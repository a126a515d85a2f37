"""Make the drawn simulations of the recorded realsim runs again on the simulator that made
them (commit e3af952), three ways: as recorded; with each send delayed by a measured
release; and with each job's answer delayed by a measured answer too. Writes, per run,
every draw's mean and loads after warm-up (``bench realsim-table --draws``).

Run from a copy of e3af952 with e3af952-delays.patch applied (the delays as this branch
models them, ported to that simulator), reading the recorded runs and this branch's
terms.py from its tree WT:

    git archive e3af952 compass_celery dags | tar -x -C /tmp/old
    cd /tmp/old && patch -p1 < WT/docs/results/realsim-criterion/e3af952-delays.patch
    PYTHONPATH=/tmp/old python WT/docs/results/realsim-criterion/replay_e3af952.py WT OUT.json
"""

import glob
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

from compass_celery.cli import SIM_DRAWS
from compass_celery.cli import _per_task_cost as per_task_cost
from compass_celery.sim.runner import simulate_draws
from compass_celery.workload import load_workload

tree, out_path = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("terms", f"{tree}/compass_celery/bench/terms.py")
terms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(terms)
out = {}
for f in sorted(glob.glob(f"{tree}/docs/results/realsim/*.json")):
    d = json.loads(Path(f).read_text())
    cmd = Path(f[:-5] + ".txt").read_text().splitlines()[0]
    w = load_workload(f"{tree}/" + cmd.split("--workload ")[1].split()[0]).reseeded(d["seed"])
    hop, _, m = per_task_cost(d, False)
    r = d["policies"]["compass"]
    skip = int(len(r["per_job"]) * 0.1)
    jobs = [
        j
        for j in r["per_job"]
        if j["i"] >= skip and j.get("latency_ms") is not None and j["outcome"] in ("met", "late")
    ]
    preds = {n: {t: s.preds(t) for t in s.nodes} for n, s in w.dags.items()}
    rel, ans = terms.release_delays(r["prediction_rows"], jobs, preds)
    variants = {
        "recorded-sim": m,
        "+releases": replace(m, releases_ms=tuple(rel)),
        "+releases+answers": replace(m, releases_ms=tuple(rel), answers_ms=tuple(ans)),
    }
    res = {}
    for key, mm in variants.items():
        sp = simulate_draws(
            w, ["compass"], mm, SIM_DRAWS, rate=d["rate_per_s"], jobs=r["jobs"], hop_ms=hop
        )["compass"]
        res[key] = {"draw_means_ms": sp["draw_means_ms"], "draw_loads": sp["draw_loads"]}
    name = f.split("/")[-1][:-5]
    out[name] = res
    print(
        name,
        "real",
        r["latency_ms"]["mean"],
        {k: (min(v["draw_means_ms"]), max(v["draw_means_ms"])) for k, v in res.items()},
        flush=True,
    )
Path(out_path).write_text(json.dumps(out, indent=1))
