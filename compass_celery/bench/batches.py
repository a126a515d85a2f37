"""Batched passes on the benchmark's real workers, summed up as the simulator sums its own.

Each batched task body (``emulated.record_batch``) appends ``[size, held ms]`` to a list
in the benchmark's ledger: the inputs of the pass, and the workload ms from the worker
entering the call to the body's start (claiming the waiting inputs, and waiting for more
while a batch forms). Read here into the simulator's ``batching`` record
(``sim.stats.batch_summary``), so that the real cluster and the simulator print through
one table (``sim.batching.tables``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ..sim.stats import batch_summary

#: A pass counts as held open when its forming took longer than this (workload ms): below
#: it is the claim's round trip to Redis, which every pass pays, held or not.
HELD_MS = 0.5


def summarize(passes: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """``[(size, held ms)]`` as the simulator's batching record: sizes (mean, p50, p99,
    histogram), the share of passes held open, the hold per pass and per input (each
    input of a pass counted with the pass's hold: an upper bound for inputs that joined
    during it). Empty when no pass ran."""
    if not passes:
        return {}
    sizes = [int(n) for n, _ in passes]
    holds = [float(h) if h > HELD_MS else 0.0 for _, h in passes]
    per_input = [h for n, h in zip(sizes, holds, strict=True) for _ in range(n)]
    cluster = SimpleNamespace(batches=sizes, holds=holds)
    return batch_summary([SimpleNamespace(index=0, held=per_input)], cluster, 0.0)


def read_batches(ledger: Any, key: str) -> dict[str, Any]:
    """The passes recorded under ``key`` in the ledger, summarized (:func:`summarize`)."""
    passes = []
    for raw in ledger.lrange(key, 0, -1):
        try:
            size, held = json.loads(raw)
            passes.append((int(size), float(held)))
        except (ValueError, TypeError):
            continue
    return summarize(passes)
