"""Batching: what a batched forward pass costs, and where joining a forming batch pays.

One forward pass over n inputs costs far less than n passes (this project measured
all-MiniLM-L6-v2 on one CPU thread at 11.7 ms for one sentence, 3.25 ms a sentence in a
batch of 8, 2.97 ms in a batch of 32). A task that declares
``compass_batch={"max_size": 32, "max_wait_ms": 5}`` is run by a worker together with
up to ``max_size - 1`` queued messages of the same task and model. So a task sent to a
worker where such a batch is forming (same key waiting, fewer than ``max_size``) does
not pay a full run: it adds ``per_item_ms`` to that batch and finishes when the batch
does. The planner (``planner.walk``) counts that; everything here is the pure part the
planner, the simulator and the runtime share.

Units: ms, as everywhere in the planner. Pure: no I/O, no Celery.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

#: What a task's ``compass_batch`` option (and a workload node's ``batch``) may set.
BATCH_FIELDS = ("max_size", "max_wait_ms", "base_ms", "per_item_ms")
#: Largest batch anyone may ask for: beyond this a "batch" is a memory accident.
MAX_BATCH = 4096


class BatchError(ValueError):
    """A batch option that makes no sense; the message names the field."""


def _ms(value: Any, field: str, *, positive: bool = False) -> float:
    """A finite number of ms, >= 0 (> 0 when ``positive``); else :class:`BatchError`."""
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise BatchError(f"{field}: must be a number of milliseconds {need}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BatchCurve:
    """Run time of a batch of n inputs: ``base_ms + per_item_ms * (n - 1)``.

    Linear is what the measurements show past a few inputs (fixed cost of a pass, then a
    near-constant cost per input); it is also what makes "joining costs ``per_item_ms``"
    exact, so the planner's marginal cost and the simulator's batch run time agree.
    """

    base_ms: float
    per_item_ms: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_ms", _ms(self.base_ms, "batch.base_ms"))
        object.__setattr__(self, "per_item_ms", _ms(self.per_item_ms, "batch.per_item_ms"))

    def of(self, n: int) -> float:
        """ms for one pass over ``n`` inputs (n >= 1)."""
        if n < 1:
            raise BatchError(f"batch size must be at least 1, got {n}")
        return self.base_ms + self.per_item_ms * (n - 1)

    def per_input_ms(self, n: int) -> float:
        """Average ms per input in a batch of ``n``: what a throughput table lists."""
        return self.of(n) / n

    @classmethod
    def from_speedup(cls, single_ms: float, speedup: float, at: int) -> BatchCurve:
        """The curve through a single-input run time and a declared throughput speed-up
        at batch size ``at`` (``speedup`` = inputs per second in a batch of ``at`` over
        inputs per second one at a time: a batch of ``at`` takes ``at*single/speedup``)."""
        single = _ms(single_ms, "batch.base_ms")
        if isinstance(speedup, bool) or not isinstance(speedup, int | float) \
                or not math.isfinite(speedup) or not 1.0 <= speedup <= max(at, 1):
            raise BatchError(f"batch.speedup: must be between 1 and the batch size {at}, "
                             f"got {speedup!r}")
        if isinstance(at, bool) or not isinstance(at, int) or at < 1:
            raise BatchError(f"batch.at: must be an integer >= 1, got {at!r}")
        if at == 1:
            return cls(single, single)
        return cls(single, (at * single / speedup - single) / (at - 1))

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, float]]) -> BatchCurve:
        """Least-squares line through measured (batch size, ms) pairs.

        With one distinct size the slope is unknown: the curve is then no gain
        (``per_item = base``, the run time of a single input), which is what a worker
        that has only ever run one at a time can honestly claim. A fitted intercept or
        slope below 0 (noise) is clipped to 0."""
        pts = [(float(n), float(ms)) for n, ms in samples]
        if not pts:
            raise BatchError("batch fit: no samples")
        for n, ms in pts:
            if not n >= 1 or not math.isfinite(ms) or ms < 0:
                raise BatchError(f"batch fit: bad sample ({n!r}, {ms!r}); sizes >= 1, "
                                 "times >= 0 ms")
        k = float(len(pts))
        return _line(sum(n - 1.0 for n, _ in pts) / k, sum(ms for _, ms in pts) / k,
                     sum((n - 1.0) ** 2 for n, _ in pts) / k,
                     sum((n - 1.0) * ms for n, ms in pts) / k, len({n for n, _ in pts}))


def _line(mx: float, my: float, mxx: float, mxy: float, sizes: int) -> BatchCurve:
    """The least-squares curve from the means of x = size - 1, ms, x*x and x*ms over
    samples of ``sizes`` distinct batch sizes (one size: its ms per input, no gain)."""
    var = mxx - mx * mx
    if sizes < 2 or var <= 1e-9:
        single = my / (mx + 1.0)
        return BatchCurve(single, single)
    slope = max((mxy - mx * my) / var, 0.0)
    return BatchCurve(max(my - slope * mx, 0.0), slope)


class CurveLearner:
    """A batched task's cost curve, learned from the passes a worker measures.

    :meth:`BatchCurve.fit` over exponentially decayed moments of (size, ms): recent
    passes count most, so the curve follows a model that got faster or a machine that
    got busier, and no list of samples grows. A sample may carry a weight (each input
    of a pass of n reports the pass once with weight 1/n, so a pass counts once). Until
    two sizes have been seen the slope is unknown and the curve claims no gain."""

    #: Weight of one whole pass in the moments: about the last 1/alpha passes count.
    ALPHA = 0.05

    def __init__(self, alpha: float = ALPHA) -> None:
        self.alpha = alpha
        self._m: tuple[float, ...] = (0.0,) * 4  # decayed means: x, ms, x*x, x*ms (x = n-1)
        self._sizes: set[int] = set()
        self._untaken = 0.0  # weight folded in since the curve was last taken

    def add(self, size: int, ms: float, weight: float = 1.0) -> None:
        """Fold in one measured pass of ``size`` inputs that took ``ms``."""
        if size < 1 or not math.isfinite(ms) or ms < 0 or weight <= 0:
            return
        x = float(size - 1)
        a = min(1.0, self.alpha * weight) if self._sizes else 1.0  # the first sets them
        sample = (x, ms, x * x, x * ms)
        self._m = tuple((1.0 - a) * m + a * v for m, v in zip(self._m, sample, strict=True))
        self._sizes.add(size)
        self._untaken += weight

    def curve(self) -> BatchCurve | None:
        """The fitted curve; None before any pass."""
        return _line(*self._m, len(self._sizes)) if self._sizes else None

    def take(self) -> BatchCurve | None:
        """The curve, once a whole pass's weight was folded in since it was last taken;
        None before: a worker stores the curve once per pass, not once per input."""
        if self._untaken < 1.0 - 1e-9:
            return None
        self._untaken = 0.0
        return self.curve()


@dataclass(frozen=True)
class BatchSpec:
    """A task's ``compass_batch``: up to ``max_size`` inputs per pass, a worker waiting at
    most ``max_wait_ms`` for more, and the cost curve (None: no measured gain, every
    input costs the task's ``exec_ms``)."""

    max_size: int
    max_wait_ms: float = 0.0
    curve: BatchCurve | None = None
    #: The key its batches form under on a real worker (``batch_key`` of its Celery task
    #: and model), so a Dag node and a plain call of the same task batch together; ''
    #: keys by the planner's node name (the simulator's workloads).
    key: str = ""

    def __post_init__(self) -> None:
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH:
            raise BatchError(f"batch.max_size: must be an integer between 1 and {MAX_BATCH}, "
                             f"got {size!r}")
        object.__setattr__(self, "max_wait_ms", _ms(self.max_wait_ms, "batch.max_wait_ms"))

    def curve_for(self, exec_ms: float) -> BatchCurve:
        """The cost curve of a task whose single run takes ``exec_ms``."""
        return self.curve if self.curve is not None else BatchCurve(exec_ms, exec_ms)


def batch_spec(raw: Mapping[str, Any], exec_ms: float | None = None) -> BatchSpec:
    """A ``compass_batch`` option or a workload node's ``batch`` as a :class:`BatchSpec`.

    ``{"max_size": 32, "max_wait_ms": 5, "per_item_ms": 2.7}``; ``base_ms`` defaults to
    the task's ``exec_ms`` (its single-input run time), and with neither ``per_item_ms``
    nor ``base_ms`` the curve is left to be learned (:class:`CurveLearner`). A bad field
    raises :class:`BatchError` naming it."""
    if not isinstance(raw, Mapping):
        raise BatchError(f"batch: expected an object with {', '.join(BATCH_FIELDS)}, "
                         f"got {raw!r}")
    unknown = sorted(set(raw) - set(BATCH_FIELDS))
    if unknown:
        raise BatchError(f"batch: unknown fields {unknown} (allowed: {', '.join(BATCH_FIELDS)})")
    if "max_size" not in raw:
        raise BatchError("batch.max_size: missing")
    curve = None
    if "per_item_ms" in raw or "base_ms" in raw:
        base = raw.get("base_ms", exec_ms)
        if base is None:
            raise BatchError("batch.base_ms: missing (no exec_ms to default to)")
        base = _ms(base, "batch.base_ms")
        curve = BatchCurve(base, _ms(raw.get("per_item_ms", base), "batch.per_item_ms"))
    return BatchSpec(raw["max_size"], raw.get("max_wait_ms", 0.0), curve)


def batch_record(spec: BatchSpec | None) -> dict[str, Any] | None:
    """``spec`` as JSON data (a job's node record): its ``compass_batch`` fields and key."""
    if spec is None:
        return None
    out: dict[str, Any] = {"max_size": spec.max_size, "max_wait_ms": spec.max_wait_ms,
                           "key": spec.key}
    if spec.curve is not None:
        out.update(base_ms=spec.curve.base_ms, per_item_ms=spec.curve.per_item_ms)
    return out


def batch_from_record(raw: Any) -> BatchSpec | None:
    """A :func:`batch_record` back as a spec; None when absent or not one (a record
    written before batching, or garbled: the node is then placed as an unbatched task)."""
    if not isinstance(raw, Mapping):
        return None
    fields = {k: v for k, v in raw.items() if k in BATCH_FIELDS}
    try:
        spec = batch_spec(fields)
    except BatchError:
        return None
    key = raw.get("key")
    return replace(spec, key=key) if isinstance(key, str) else spec


def batch_key(task: str, model: str | None) -> str:
    """The key a forming batch is published under: same task and same model batch."""
    return f"{task}|{model or ''}"


class Forming(NamedTuple):
    """A batch forming in one worker's queue (``WorkerView.forming``): how many inputs
    wait in it, and ms from now until the worker starts it (the work queued ahead)."""

    size: int
    start_ms: float


def join_finish_ms(forming: Forming | None, spec: BatchSpec, curve: BatchCurve, *,
                   ready_ms: float, load_ms: float, speed: float) -> float | None:
    """When a task that joins ``forming`` finishes (ms from now), or None when it cannot
    join: no batch forming, it is full, or it starts before the task's inputs are ready.

    The task starts with the batch and finishes with it: the batch's start, the model's
    load if any, then one pass over one more input."""
    if forming is None or forming.size >= spec.max_size or ready_ms > forming.start_ms:
        return None
    return forming.start_ms + load_ms + curve.of(forming.size + 1) / speed


def forming_from_count(waiting: int, spec: BatchSpec, curve: BatchCurve, *,
                       queue_ms: float, speed: float) -> Forming | None:
    """The batch forming behind ``waiting`` queued inputs of one key on a worker whose
    queue holds ``queue_ms`` of work (what a real worker publishes: a count, not a
    batch): its open (last) batch holds ``(waiting - 1) % max_size + 1`` of them, queued
    last, so it starts once the work ahead of them is done. None: nothing waits, or the
    open batch is full (a task sent now starts a new one)."""
    if waiting <= 0:
        return None
    size = (waiting - 1) % spec.max_size + 1
    if size >= spec.max_size:
        return None
    return Forming(size, max(queue_ms - curve.of(size) / speed, 0.0))


def marginal_ms(curve: BatchCurve, size: int) -> float:
    """What input number ``size + 1`` adds to a batch of ``size`` (base for the first)."""
    return curve.base_ms if size <= 0 else curve.per_item_ms


def hold_until_ms(first_sent_ms: float, spec: BatchSpec, *, waiting: int,
                  others_ready: bool, latest_start_ms: float = math.inf) -> float:
    """Until when a worker may hold a batch of ``waiting`` inputs open for more (workload ms).

    It starts at once (returns ``first_sent_ms`` or earlier) when the batch is full, when
    only one input waits (no sign that more are coming: an idle worker adds no latency),
    or when other work is ready behind it. Else it waits until ``max_wait_ms`` after the
    oldest input arrived, and never past the tightest latest start of its members (the
    deadline less the time still needed, ``planner.admission``)."""
    if waiting >= spec.max_size or waiting <= 1 or others_ready or spec.max_wait_ms <= 0:
        return -math.inf
    return min(first_sent_ms + spec.max_wait_ms, latest_start_ms)
