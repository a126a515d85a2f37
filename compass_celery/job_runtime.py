"""Worker side of the job runtime: inputs in, outputs out, successors on.

Runs in the worker that executed a node: it resolves the node's inputs (local
output cache first, then Redis), records the output through ``complete.lua``,
re-checks each released successor's placement against fresh state (the
adjustment phase) and sends it.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from .jobs import INPUT_REF, JobError, JobKeys, JobTimeout, fail_job, send_node
from .planner.adjust import reassign
from .planner.types import ClusterView, TaskSpec
from .scripts import script
from .state import StateUnavailable

if TYPE_CHECKING:
    from .app import Compass

logger = logging.getLogger("compass_celery.jobs")


class OutputCache:
    """Recent node outputs on a worker, for collocated successors (LRU, capped in bytes
    of their JSON, so a few large outputs cannot take the worker's memory)."""

    def __init__(self, capacity_bytes: int = 256 * 2**20) -> None:
        self.capacity_bytes = capacity_bytes
        self._items: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def put(self, job: str, node: str, value: Any, size: int) -> None:
        if size > self.capacity_bytes:
            return  # would evict everything else; its successors read Redis
        old = self._items.pop((job, node), None)
        if old is not None:
            self.bytes -= old[1]
        self._items[(job, node)] = (value, size)
        self.bytes += size
        while self.bytes > self.capacity_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def get(self, job: str, node: str) -> tuple[bool, Any]:
        key = (job, node)
        if key in self._items:
            self.hits += 1
            return True, self._items[key][0]
        self.misses += 1
        return False, None


# -- completion (runs on the worker that finished a node) ------------------------------
class JobRuntime:
    """Worker-side job bookkeeping: inputs in, outputs out, successors on."""

    def __init__(self, compass: Compass, worker_name: str) -> None:
        self.c, self.name = compass, worker_name
        self.outputs = OutputCache(int(compass.settings["output_cache_mb"] * 2**20))
        client = compass.store.client
        self._complete = client.register_script(script("complete"))

    def keys(self, job_id: str) -> JobKeys:
        return JobKeys.of(self.c.settings["key_prefix"], job_id)

    def job_state(self, job_id: str) -> str:
        state = self.c.store.client.hget(self.keys(job_id).job, "state")
        return state.decode() if state else "UNKNOWN"

    def resolve_inputs(self, job: dict[str, Any], args: Any) -> None:
        """Replace the input reference (first arg) in place with the predecessors' outputs."""
        if not isinstance(args, list) or not args or not isinstance(args[0], dict) \
                or INPUT_REF not in args[0]:
            return
        ref = args[0][INPUT_REF]
        preds, job_id = ref["preds"], job["id"]
        values: dict[str, Any] = {}
        missing = []
        for p in preds:
            hit, value = self.outputs.get(job_id, p)
            if hit:
                values[p] = value
            else:
                missing.append(p)
        if missing:
            raw = self.c.store.client.hmget(self.keys(job_id).outputs, missing)
            for p, r in zip(missing, raw, strict=True):
                if r is None:
                    raise JobError(f"job {job_id}: output of {p!r} is gone (expired?)")
                values[p] = json.loads(r)
        args[0] = values[preds[0]] if ref.get("single") else [values[p] for p in preds]

    def on_success(self, job: dict[str, Any], task_id: str, retval: Any,
                   timing: dict[str, float]) -> list[str]:
        """Record the node's output and send the successors it released."""
        job_id, node = job["id"], job["node"]
        keys = self.keys(job_id)
        client = self.c.store.client
        cfg = self.c.settings
        try:
            output = json.dumps(retval)
        except (TypeError, ValueError) as exc:
            self.fail(job, task_id, exc, "output is not JSON-serialisable")
            return []
        if len(output) > cfg["max_output_kb"] * 1024:
            self.fail(job, task_id, ValueError(
                f"output is {len(output) / 1024:.0f} KB, over compass_max_output_kb="
                f"{cfg['max_output_kb']}"), "output too large")
            return []
        raw_job = client.hmget(keys.job, ["nodes", "plan", "deadline", "state"])
        if raw_job[0] is None:
            logger.warning("compass: job %s is unknown or expired; result of %r dropped",
                           job_id, node)
            return []
        nodes, plan = json.loads(raw_job[0]), json.loads(raw_job[1])
        if float(raw_job[2]) < time.time():
            self.fail(job, task_id, JobTimeout("job deadline passed"), "timed out")
            return []
        info = {"worker": self.name, "task_id": task_id, "moved_from": job.get("moved_from"),
                "planned": (plan.get(node) or {}).get("worker"), **timing}
        succs = nodes[node]["succs"]
        result = self._complete(keys=keys.all(), args=[node, output, int(cfg["job_ttl_s"]),
                                                       json.dumps(info), *succs])
        status = result[0].decode() if isinstance(result[0], bytes) else result[0]
        ready = [r.decode() if isinstance(r, bytes) else r for r in result[1:]]
        if status in ("missing", "late") or (status == "duplicate" and not ready):
            logger.warning("compass: completion of %s/%s ignored (%s)", job_id, node, status)
            return []
        if status == "duplicate":
            logger.warning("compass: completion of %s/%s is a duplicate; sending %s, released "
                           "but never sent", job_id, node, ready)
        else:
            self.outputs.put(job_id, node, retval, len(output))
        resume = status == "duplicate"
        sent = [self._send_successor(job_id, succ, nodes, plan, keys, resume)
                for succ in ready]
        return [t for t in sent if t]

    def _send_successor(self, job_id: str, succ: str, nodes: dict[str, Any],
                        plan: dict[str, Any], keys: JobKeys, resume: bool = False
                        ) -> str | None:
        c, node = self.c, nodes[succ]
        planned = plan.get(succ)
        placement: Any = planned
        moved_from = None
        try:
            snapshot = c.reader.get()
        except StateUnavailable:
            snapshot = None
        if snapshot is not None and snapshot.workers and c.policy.name == "compass":
            where = self._input_locations(keys, node["preds"], nodes)
            spec = TaskSpec(succ, node["model"], node["exec_ms"], node["output_kb"])
            cluster = ClusterView.of(snapshot.workers, c.model_sizes(), snapshot.taken_at)
            better = reassign(spec, planned["worker"] if planned else "", cluster, where,
                              factor=c.settings["move_factor"], is_join=len(node["preds"]) > 1)
            if better is not None:
                moved_from = planned["worker"] if planned else None
                placement = better
                from .signals import task_reassigned

                task_reassigned.send(sender=c, job_id=job_id, node=succ, old=moved_from,
                                     new=better.worker)
        ref = {INPUT_REF: {"preds": node["preds"], "single": len(node["preds"]) == 1}}
        task_id = send_node(c, job_id, succ, node, placement, ref, moved_from, resume)
        if task_id and not resume and planned and planned["worker"] != "*":
            c.store.add_pending(planned["worker"], -planned["run_ms"])  # no longer pending
        return task_id

    def _input_locations(self, keys: JobKeys, preds: list[str],
                         nodes: dict[str, Any]) -> dict[str, float]:
        where: dict[str, float] = {}
        for p, raw in zip(preds, self.c.store.client.hmget(keys.info, preds), strict=True):
            worker = json.loads(raw).get("worker") if raw else self.name
            where[worker] = where.get(worker, 0.0) + float(nodes[p]["output_kb"])
        return where

    def fail(self, job: dict[str, Any], task_id: str, exc: BaseException, why: str = "",
             task: str | None = None) -> str:
        """Fail the job once (fail.lua), revoke its outstanding tasks, release pending."""
        return fail_job(self.c, job["id"], {
            "job": job["id"], "node": job["node"], "task": task, "task_id": task_id,
            "worker": self.name,
            "exc_type": type(exc).__name__, "exc": str(exc)[:2000], "why": why})
