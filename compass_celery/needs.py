"""What a task needs: its model, run time and output size, resolved in one order.

call option (``apply_async(..., compass={...})``) -> task declaration
(``@app.task(compass_model=..., compass_exec_ms=...)``) -> learned profile
(EWMA of measured runs, kept in the state store) -> ``compass_default_exec_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .errors import CompassInputError
from .planner.batch import BatchCurve, BatchError, BatchSpec, batch_key, batch_spec
from .planner.types import TaskSpec

#: How to declare a model compass does not know, said by every refusal of one.
DECLARE_MODEL = ("add it to compass_models (its size in MB) or register its loader with "
                 "@compass_celery.model")


class TaskDeclarationError(CompassInputError):
    """A task's compass options are malformed (negative run time, bad model name)."""


@dataclass(frozen=True)
class TaskNeeds:
    """What placement needs of one task call: model, run time, output size, and their source."""

    task: str
    model: str | None
    exec_ms: float
    output_kb: float
    exec_source: str  # "call", "declared", "learned" or "default"
    #: Its ``compass_batch``, keyed by task and model (``planner.batch``); None: unbatched.
    batch: BatchSpec | None = None

    @property
    def batch_key(self) -> str:
        """The key its inputs are counted under on a worker ('' when unbatched)."""
        return self.batch.key if self.batch is not None else ""

    def spec(self, batch_aware: bool = True) -> TaskSpec:
        """The planner's :class:`TaskSpec` for these needs (``batch_aware`` off: placed as
        an unbatched task, blind to the batches forming in queues)."""
        return TaskSpec(name=self.task, model=self.model, exec_ms=self.exec_ms,
                        output_kb=self.output_kb,
                        batch=self.batch if batch_aware else None)


def profile_key(task: str, model: str | None) -> str:
    """Field of a learned run time in the profiles table."""
    return f"{task}|{model or ''}"


def batch_profile_key(task: str, model: str | None) -> str:
    """Field of a batched task's learned ``per_item_ms`` (what each input after the first
    adds to a pass) in the profiles table; its ``base_ms`` is under :func:`profile_key`."""
    return f"{profile_key(task, model)}|per_item"


#: Task part of a learned load time's field in the profiles table (no task is named so).
LOAD_PROFILE = "compass.load"


#: A measured run this many times off the learned one (either way) replaces it instead
#: of being averaged in: the task changed (dask's outlier rule, widened from 2x).
OUTLIER_RATIO = 3.0


def learn_run_ms(learned: float | None, ms: float, alpha: float) -> float:
    """The learned run time after one measured run ``ms``: an EWMA with weight ``alpha``,
    reset to ``ms`` by an outlier (:data:`OUTLIER_RATIO`) or when nothing was learned.
    The one definition: both state stores apply it (state/records.py)."""
    if learned is None or not learned / OUTLIER_RATIO <= ms <= learned * OUTLIER_RATIO:
        return ms
    return learned + alpha * (ms - learned)


def learned_loads(profiles: Mapping[str, float]) -> dict[str, float]:
    """Model -> learned load time (ms, storage to device), from the profiles table."""
    prefix = f"{LOAD_PROFILE}|"
    return {k[len(prefix):]: ms for k, ms in profiles.items() if k.startswith(prefix)}


#: Call options that say when the answer is wanted, not what the task needs
#: (``compass={"deadline_ms": 400}`` or ``compass={"slo": "interactive"}``).
SLO_OPTIONS = ("deadline_ms", "slo", "on_miss")


def call_slo(call_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The SLO part of a call's ``compass`` options (empty when it has none)."""
    call = (call_options or {}).get("compass") or {}
    return {k: call[k] for k in SLO_OPTIONS if k in call} if isinstance(call, Mapping) else {}


def batch_options(task: Any) -> BatchSpec | None:
    """A task's ``compass_batch`` declaration, checked (None: not batched); a bad one
    raises :class:`TaskDeclarationError` naming the field."""
    raw = getattr(task, "compass_batch", None) if task is not None else None
    if raw is None:
        return None
    try:
        return batch_spec(raw, getattr(task, "compass_exec_ms", None))
    except BatchError as exc:
        raise TaskDeclarationError(f"task {getattr(task, 'name', '?')!r}: compass_{exc}") \
            from None


def check_batched_call(task: Any, args: Any, kwargs: Any) -> None:
    """A batched task is sent one input at a time: exactly one positional argument."""
    if batch_options(task) is not None and (len(args or ()) != 1 or kwargs):
        raise TaskDeclarationError(
            f"task {task.name!r} is batched (compass_batch): send one input per call, as "
            f"its only argument (task.delay(x)); got args={args!r} kwargs={kwargs!r}")


def _number(value: Any, what: str, task: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TaskDeclarationError(f"task {task!r}: {what} must be a finite number, "
                                   f"got {value!r}")
    if value < 0:
        raise TaskDeclarationError(f"task {task!r}: {what} must be >= 0, got {value!r}")
    return float(value)


def declared(task: Any) -> dict[str, Any]:
    """The compass options declared on a task class (``compass_model`` etc.)."""
    out = {}
    for key in ("model", "exec_ms", "output_kb"):
        value = getattr(task, f"compass_{key}", None) if task is not None else None
        if value is not None:
            out[key] = value
    return out


def resolve_needs(name: str, task: Any, call_options: Mapping[str, Any] | None,
                   learned: Mapping[str, float], default_exec_ms: float) -> TaskNeeds | None:
    """What the task needs, or None when it carries no compass options at all."""
    decl = declared(task)
    call = dict((call_options or {}).get("compass") or {})
    unknown = set(call) - {"model", "exec_ms", "output_kb", *SLO_OPTIONS}
    if unknown:
        raise TaskDeclarationError(f"task {name!r}: unknown compass call option(s) "
                                   f"{sorted(unknown)}; use model, exec_ms, output_kb, "
                                   f"{', '.join(SLO_OPTIONS)}")
    slo = {k: call.pop(k) for k in SLO_OPTIONS if k in call}
    merged = {**decl, **call}
    if "model" not in merged and "exec_ms" not in merged and not slo:
        return None  # a deadline alone makes it compass's to place (and admit)
    model = merged.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise TaskDeclarationError(f"task {name!r}: model must be a non-empty string, "
                                   f"got {model!r}")
    output_kb = _number(merged.get("output_kb", 0.0), "output_kb", name)
    if "exec_ms" in call:
        exec_ms, source = _number(call["exec_ms"], "exec_ms", name), "call"
    elif "exec_ms" in decl:
        exec_ms, source = _number(decl["exec_ms"], "exec_ms", name), "declared"
    elif (key := profile_key(name, model)) in learned:
        exec_ms, source = learned[key], "learned"
    else:
        exec_ms, source = default_exec_ms, "default"
    batch = batch_options(task)
    if batch is not None:
        batch = with_learned_curve(replace(batch, key=batch_key(name, model)), exec_ms,
                                   learned.get(batch_profile_key(name, model)))
    return TaskNeeds(name, model, exec_ms, output_kb, source, batch)


def with_learned_curve(batch: BatchSpec, exec_ms: float, per_item_ms: float | None
                       ) -> BatchSpec:
    """``batch`` with the curve its workers learned (``per_item_ms`` under
    :func:`batch_profile_key`, from ``exec_ms`` for one input) where none is declared;
    as it is when a curve is declared or nothing was learned yet (then every input is
    charged a whole run: no gain is claimed before one is measured)."""
    if batch.curve is not None or per_item_ms is None:
        return batch
    return replace(batch, curve=BatchCurve(exec_ms, min(float(per_item_ms), exec_ms)))


def wants_learned(needs: TaskNeeds) -> bool:
    """Whether learned profiles would change ``needs``: its run time is the default, or
    it is batched with no curve declared."""
    return needs.exec_source == "default" or (needs.batch is not None
                                              and needs.batch.curve is None)
