"""``python -m compass_celery.sim --workload PATH [--workers N] [--policies a,b] [--json OUT]``.

``--admission on|off`` and ``--max-queue-ms`` are the runtime's ``compass_admission`` and
``compass_max_queue_ms``: jobs of templates the workload gives an SLO are judged at
arrival and shed once they fall behind, by the planner's own rules. ``--table`` prints
the result and its SLO columns (rejected, shed, late, attainment, goodput per class) as
text instead of JSON; ``--warm`` starts the workers with models resident.

A standalone entry to the simulator (the ``compass-celery simulate`` command wraps
the same :func:`simulate`); ``--compare-pending`` runs compass with and without
planned-not-sent work counted in its backlog.

Besides the runtime's policies, ``--policies`` takes ``static-replicas``, a simulator-only
reference: replicas per model sized from the workload's expected demand, packed onto the
GPUs before the run, preloaded and never evicted; each task goes to the earliest-finish
worker holding its model (``planner.static``). The real runtime cannot run it.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import CompassInputError
from ..planner import POLICIES
from ..tables import result_table
from ..workload import load_workload
from .runner import MOVE_FACTOR, SIM_ONLY_POLICIES, compare_count_pending, simulate
from .stats import slo_table

#: Everything ``--policies`` accepts, and its default: the runtime's policies, then the
#: simulator-only references.
KNOWN = (*POLICIES, *SIM_ONLY_POLICIES)


def main(argv: list[str] | None = None) -> int:
    """Run the simulator from the command line; 2 on a bad workload or argument."""
    ap = argparse.ArgumentParser(prog="python -m compass_celery.sim", description=__doc__)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--policies", default=",".join(KNOWN),
                    help=f"comma-separated, default all: {', '.join(KNOWN)}; "
                         f"{', '.join(SIM_ONLY_POLICIES)} is a simulator-only reference "
                         "(static replicas from the workload's expected demand, preloaded, "
                         "never evicted), which the real runtime does not support")
    ap.add_argument("--rate", type=float, help="jobs per second (overrides the file)")
    ap.add_argument("--jobs", type=int, help="number of jobs (overrides the file)")
    ap.add_argument("--refresh-ms", type=float, default=0.0, help="snapshot staleness, ms")
    ap.add_argument("--hop-ms", type=float, default=0.0,
                    help="modelled dispatch overhead per task, workload ms (calibrate from bench)")
    ap.add_argument("--hop-unplanned", action="store_true",
                    help="plans leave the hop out (workers publish none), as before workers "
                         "learned theirs")
    ap.add_argument("--move-factor", type=float, default=MOVE_FACTOR,
                    help="re-place a successor when its worker's backlog exceeds this times "
                         "its run time (compass_move_factor)")
    ap.add_argument("--compare-pending", action="store_true")
    ap.add_argument("--no-demand", action="store_true",
                    help="plan without recent demand per model (no eviction pricing), as "
                         "the real runtime does until it feeds ClusterView.demand")
    ap.add_argument("--admission", choices=("on", "off"), default="on",
                    help="refuse at arrival a job its plan says will miss its SLO deadline "
                         "(off: take it, marked late; it is still shed once behind)")
    ap.add_argument("--max-queue-ms", type=float,
                    help="refuse any job with more than this much work queued ahead of it")
    ap.add_argument("--warm", action="store_true",
                    help="start every worker with the models static-replicas would give it "
                         "resident (unpinned): a cluster that has been serving")
    ap.add_argument("--batching", choices=("on", "blind", "off"), default="on",
                    help="for nodes a workload marks batchable: workers batch and compass "
                         "places by their forming batches (on), workers batch but placement "
                         "ignores it (blind), or every task runs alone (off)")
    ap.add_argument("--table", action="store_true",
                    help="print text tables (latency, then SLO columns) instead of JSON")
    ap.add_argument("--json", help="write the result object here")
    args = ap.parse_args(argv)
    try:
        workload = load_workload(args.workload)
        kw = {"workers": args.workers, "rate": args.rate, "jobs": args.jobs,
              "refresh_ms": args.refresh_ms, "hop_ms": args.hop_ms,
              "move_factor": args.move_factor, "demand": not args.no_demand,
              "admission": args.admission == "on", "max_queue_ms": args.max_queue_ms,
              "warm": args.warm, "plan_hop": not args.hop_unplanned}
        if args.compare_pending:
            if args.batching != "on":
                ap.error("--batching applies to a policy run, not --compare-pending")
            result = compare_count_pending(workload, **kw)
        else:
            names = [p.strip() for p in args.policies.split(",") if p.strip()]
            unknown = [p for p in names if p not in KNOWN]
            if unknown:
                ap.error(f"unknown policies {unknown}; known: {', '.join(KNOWN)}")
            result = simulate(workload, names, batching=args.batching, **kw)
    except CompassInputError as exc:  # a bad workload file, or a bad --jobs/--rate
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    if args.table and "policies" in result:
        slo = slo_table(result)
        print(result_table(result) + (f"\n\n{slo}" if slo else ""))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
