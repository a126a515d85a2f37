"""Predicted against measured, term by term: how right the planner's cost model was.

For every node that ran where its job's plan put it, the plan (made at submission)
predicted a queue wait, a model load, a run time and a finish (ms after submission);
the worker measured the same four. Pure: rows in, statistics out, so the benchmark
and a test compute them alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

#: The terms compared, in the order reported: (plan field, measured field).
TERMS = {"wait": ("wait_ms", "queued_ms"), "load": ("load_ms", "load_ms"),
         "run": ("run_ms", "run_ms"), "finish": ("finish_ms", "finish_ms")}


def node_rows(plan: Mapping[str, Mapping[str, Any]], info: Mapping[str, Mapping[str, Any]],
              created_s: float, nodes: Mapping[str, Mapping[str, Any]],
              time_scale: float = 1.0) -> list[dict[str, Any]]:
    """One row per node that ran on its planned worker: predicted and measured terms,
    all in workload ms (measured real ms divided by ``time_scale``)."""
    rows = []
    for name, p in plan.items():
        m = info.get(name)
        if not m or "run_ms" not in m or m.get("worker") != p.get("worker"):
            continue  # not finished, or moved at re-placement (planned elsewhere)
        preds: Sequence[str] = (nodes.get(name) or {}).get("preds") or ()
        ready = max((float(plan[q]["finish_ms"]) for q in preds if q in plan), default=0.0)
        predicted = {"wait_ms": float(p.get("wait_ms", p["start_ms"] - ready)),
                     "load_ms": float(p["load_ms"]), "run_ms": float(p["run_ms"]),
                     "finish_ms": float(p["finish_ms"])}
        measured = {"queued_ms": float(m.get("queued_ms", 0.0)),
                    "load_ms": float(m.get("load_ms", 0.0)), "run_ms": float(m["run_ms"]),
                    "finish_ms": (float(m["finished"]) - created_s) * 1000.0 / time_scale}
        rows.append({"node": name, "worker": p.get("worker"),
                     "model": (nodes.get(name) or {}).get("model"),
                     # the part of its load the plan expected a prefetch to make while
                     # it queued (not in pred_load, which is what delays its start)
                     "pred_prefetch": float(p.get("prefetch_ms", 0.0)),
                     **{f"pred_{t}": predicted[pf] for t, (pf, _) in TERMS.items()},
                     **{f"meas_{t}": measured[mf] for t, (_, mf) in TERMS.items()}})
    return rows


def _stats(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    err = meas - pred
    rel = np.abs(err) / np.maximum(np.abs(meas), 1.0)  # share of what was measured
    return {"n": int(len(pred)), "pred_median_ms": round(float(np.median(pred)), 2),
            "meas_median_ms": round(float(np.median(meas)), 2),
            # the typical error against the typical value: robust where many are near 0
            "abs_err_over_meas": round(float(np.median(np.abs(err))
                                             / max(float(np.median(np.abs(meas))), 1.0)), 3),
            "abs_err_median_ms": round(float(np.median(np.abs(err))), 2),
            "abs_err_p95_ms": round(float(np.percentile(np.abs(err), 95)), 2),
            "bias_median_ms": round(float(np.median(err)), 2),
            "rel_err_median": round(float(np.median(rel)), 3),
            "rel_err_p95": round(float(np.percentile(rel, 95)), 3)}


#: A measured "load" under this is a resident model's bookkeeping, not a load.
LOAD_MS = 10.0


def term_errors(rows: Iterable[Mapping[str, Any]], *, min_ms: float = 1.0
                ) -> dict[str, dict[str, float]]:
    """Per term: medians, absolute error (median, p95, ms), bias and relative error.

    The load term counts only tasks that loaded or were predicted to (over
    :data:`LOAD_MS`: a resident model's zero against a millisecond says nothing). The
    relative error divides by the measured value; a term under ``min_ms`` on both sides
    in most rows (a wait on an idle worker) is reported in ms only, since a ratio of
    near-zeros says nothing."""
    rows = list(rows)
    out: dict[str, dict[str, float]] = {}
    for term in TERMS:
        some = [r for r in rows if term != "load"
                or max(r["pred_load"], r["meas_load"]) >= LOAD_MS]  # loads only
        pred = np.array([float(r[f"pred_{term}"]) for r in some])
        meas = np.array([float(r[f"meas_{term}"]) for r in some])
        if not len(pred):
            continue
        stats = _stats(pred, meas)
        if np.median(np.maximum(pred, meas)) < min_ms:
            stats["rel_err_median"] = stats["rel_err_p95"] = float("nan")
        out[term] = stats
    return out


def by_model(rows: Iterable[Mapping[str, Any]], term: str) -> dict[str, dict[str, float]]:
    """One term's errors per model: which model's estimate is off."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r.get("model")), []).append(r)
    return {m: term_errors(rs)[term] for m, rs in sorted(groups.items())}


def job_rows(plans: Iterable[tuple[float, float]]) -> dict[str, float]:
    """Jobs' predicted finish (the plan's last node) against their measured latency."""
    pairs = list(plans)
    if not pairs:
        return {}
    return _stats(np.array([p for p, _ in pairs]), np.array([m for _, m in pairs]))


def hop_ms(infos: Iterable[Mapping[str, Mapping[str, Any]]], time_scale: float = 1.0,
           stat: Callable[[list[float]], float] = statistics.median) -> float | None:
    """The per-task hop a busy worker paid (workload ms; its median, or ``stat``): from
    one node's recorded end to the next node's pick on the same worker, when the next
    was already waiting. It is bookkeeping, result store, ack, the next message's fetch
    and receipt: real cost the planner and the simulator (at ``--hop-ms 0``) leave out.
    Its mean is the constant that adds the busy time the hops really took."""
    gaps = hop_gaps(infos, time_scale)
    return round(stat(gaps), 2) if gaps else None


def hop_gaps(infos: Iterable[Mapping[str, Mapping[str, Any]]],
             time_scale: float = 1.0) -> list[float]:
    """Every hop a busy worker paid (workload ms), in the workers' order: see
    :func:`hop_ms`."""
    by_worker: dict[str, list[tuple[float, float, float]]] = {}
    for info in infos:
        for m in info.values():
            if all(k in m for k in ("worker", "sent", "started", "finished")):
                by_worker.setdefault(m["worker"], []).append(
                    (float(m["started"]), float(m["finished"]), float(m["sent"])))
    gaps = []
    for nodes in by_worker.values():
        nodes.sort()
        for (_, end, _), (pick, _, sent) in zip(nodes, nodes[1:], strict=False):
            if sent <= end <= pick:  # it waited while the previous one finished
                gaps.append((pick - end) * 1000.0 / time_scale)
    return gaps


def run_overshoot_ms(rows: Iterable[Mapping[str, Any]]) -> float:
    """How much longer than planned a task's run measured (median, workload ms; 0 when
    none ran): on emulated GPUs the sleep's overshoot and the worker's own work in the
    timed window, a per-task cost like the hop."""
    gaps = run_overshoots(rows)
    return round(statistics.median(gaps), 2) if gaps else 0.0


def run_overshoots(rows: Iterable[Mapping[str, Any]]) -> list[float]:
    """Each task's run over its planned one (workload ms): see :func:`run_overshoot_ms`."""
    return [float(r["meas_run"]) - float(r["pred_run"]) for r in rows]


def _startup(row: Mapping[str, Any]) -> float | None:
    """The row's start-up (see :func:`startups`), or ``None`` when the task loaded."""
    ms = float(row["meas_load"])
    return ms if ms < LOAD_MS else None


def startups(rows: Iterable[Mapping[str, Any]]) -> list[float]:
    """Each task's start-up with its model resident (workload ms): from the worker's pick
    to the run's start, spent fetching the job's inputs and settling its queued charge.
    The worker pays it on every task, and neither the hop (which ends at the pick) nor
    the run (which starts after it) covers it. Tasks that loaded (:data:`LOAD_MS` or
    more) are left out: the simulator makes its own loads."""
    return [up for r in rows if (up := _startup(r)) is not None]


def startup_ms(rows: Iterable[Mapping[str, Any]]) -> float:
    """The median start-up (:func:`startups`; 0 when no task ran on a resident model)."""
    ups = startups(rows)
    return round(statistics.median(ups), 2) if ups else 0.0


def task_overshoots(rows: Iterable[Mapping[str, Any]], real: bool) -> list[float]:
    """What each task took beyond its planned run and the hop (workload ms), to draw
    from: its start-up on a resident model, plus (on emulated GPUs) its run's overshoot;
    a real-compute run feeds the simulator measured run times instead."""
    rows = list(rows)
    overs = [0.0] * len(rows) if real else run_overshoots(rows)
    return [(_startup(r) or 0.0) + over for r, over in zip(rows, overs, strict=True)]


def load_outcomes(rows: Iterable[Mapping[str, Any]], real_ms: float = 100.0
                  ) -> dict[str, Any]:
    """What became of the loads the plan predicted (whole: the part it expected to wait
    for and the part it expected a prefetch to make while the task queued): how many the
    task really waited for (and the error of those), how many a prefetch had already
    done while the task queued, and how many came unpredicted; and of the loads planned
    as prefetches, how many were done before the task's turn. A load is one over
    ``real_ms`` either side."""
    rows = list(rows)

    def planned(r: Mapping[str, Any]) -> float:
        return float(r["pred_load"]) + float(r.get("pred_prefetch", 0.0))
    both = [r for r in rows if planned(r) >= real_ms and r["meas_load"] >= real_ms]
    hidden = sum(1 for r in rows if planned(r) >= real_ms and r["meas_load"] < LOAD_MS)
    unpredicted = sum(1 for r in rows if r["meas_load"] >= real_ms and planned(r) < LOAD_MS)
    ahead = [r for r in rows if r.get("pred_prefetch", 0.0) >= real_ms]
    out: dict[str, Any] = {"predicted_and_waited_for": len(both),
                           "done_by_prefetch_first": hidden, "unpredicted": unpredicted,
                           "planned_as_prefetch": len(ahead),
                           "planned_as_prefetch_and_hidden": sum(
                               1 for r in ahead if r["meas_load"] < LOAD_MS)}
    if both:
        out["when_waited_for"] = _stats(np.array([r["pred_load"] for r in both]),
                                        np.array([r["meas_load"] for r in both]))
    return out


def job_segments(rows: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]],
                 nodes_of: Mapping[str, Iterable[str]]) -> list[list[Mapping[str, Any]]]:
    """The node rows of each job in ``jobs`` (the completed ones after warm-up, in the
    order the rows were taken; ``nodes_of``: each template's node names). Rows that carry
    their job's index are grouped by it; older runs' rows, kept job after job in its
    template's node order, are split where that order goes back or leaves the
    template."""
    if rows and all("job" in r for r in rows):
        by: dict[int, list[Mapping[str, Any]]] = {}
        for r in rows:
            by.setdefault(int(r["job"]), []).append(r)
        return [by.get(int(j["i"]), []) for j in jobs]
    out: list[list[Mapping[str, Any]]] = []
    k = 0
    for j in jobs:
        place = {n: i for i, n in enumerate(nodes_of[j["dag"]])}
        seg: list[Mapping[str, Any]] = []
        last = -1
        while k < len(rows) and place.get(rows[k]["node"], -1) > last:
            last = place[rows[k]["node"]]
            seg.append(rows[k])
            k += 1
        out.append(seg)
    if k != len(rows):
        raise ValueError(f"{len(rows) - k} node rows left over: rows and jobs do not match")
    return out


def release_delays(rows: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]],
                   preds_of: Mapping[str, Mapping[str, Sequence[str]]]
                   ) -> tuple[list[float], list[float]]:
    """What a job's path paid that no task's own terms cover (workload ms), per send and
    per job, for the simulator to draw (``sim.hops``):

    - a node's *release*: from its last input's recorded end to its own send (the
      finishing worker's completion: result stored, join counted, successor placed and
      sent); a source's from its job's record. A node's send is its end less its run,
      start-up and queue wait. Negative ones (a node whose recorded terms overlap its
      input's end, e.g. a re-delivered input) are left out.
    - a job's *answer*: its latency as its sender saw it less its last node's end after
      the record: the plan before the record and the answer's delivery. Only jobs whose
      every node ran where planned (all rows present) count.

    ``jobs``: the run's completed jobs after warm-up, in row order (``per_job``);
    ``preds_of``: per template, each node's inputs."""
    releases: list[float] = []
    answers: list[float] = []
    for job, seg in zip(jobs, job_segments(rows, jobs, preds_of), strict=True):
        preds = preds_of[job["dag"]]
        by = {r["node"]: r for r in seg}
        for name, r in by.items():
            ins = preds.get(name, ())
            if any(p not in by for p in ins):
                continue
            sent = (float(r["meas_finish"]) - float(r["meas_run"]) - float(r["meas_load"])
                    - float(r["meas_wait"]))
            gap = sent - max((float(by[p]["meas_finish"]) for p in ins), default=0.0)
            if gap >= 0.0:
                releases.append(gap)
        if seg and len(by) == len(preds) and job.get("latency_ms") is not None:
            answers.append(max(0.0, float(job["latency_ms"])
                               - max(float(r["meas_finish"]) for r in seg)))
    return releases, answers
