"""``python -m compass_celery.sim --workload PATH [--workers N] [--policies a,b] [--json OUT]``.

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
from ..workload import load_workload
from .runner import MOVE_FACTOR, SIM_ONLY_POLICIES, compare_count_pending, simulate

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
    ap.add_argument("--move-factor", type=float, default=MOVE_FACTOR,
                    help="re-place a successor when its worker's backlog exceeds this times "
                         "its run time (compass_move_factor)")
    ap.add_argument("--compare-pending", action="store_true")
    ap.add_argument("--no-demand", action="store_true",
                    help="plan without recent demand per model (no eviction pricing), as "
                         "the real runtime does until it feeds ClusterView.demand")
    ap.add_argument("--json", help="write the result object here")
    args = ap.parse_args(argv)
    try:
        workload = load_workload(args.workload)
        kw = {"workers": args.workers, "rate": args.rate, "jobs": args.jobs,
              "refresh_ms": args.refresh_ms, "hop_ms": args.hop_ms,
              "move_factor": args.move_factor, "demand": not args.no_demand}
        if args.compare_pending:
            result = compare_count_pending(workload, **kw)
        else:
            names = [p.strip() for p in args.policies.split(",") if p.strip()]
            unknown = [p for p in names if p not in KNOWN]
            if unknown:
                ap.error(f"unknown policies {unknown}; known: {', '.join(KNOWN)}")
            result = simulate(workload, names, **kw)
    except CompassInputError as exc:  # a bad workload file, or a bad --jobs/--rate
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
