"""Worker records: the JSON each worker publishes, and a strict decoder.

A record is written by a worker and read by every producer. Anyone with write
access to Redis can put anything there, so the decoder trusts nothing: a
garbled record raises :class:`RecordError` naming the worker and the field,
and readers skip that worker (logging why) instead of failing an enqueue.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..errors import CompassInputError
from ..needs import learn_run_ms
from ..planner.admission import plan_error_step
from ..planner.types import ModelDemand, WorkerView

MAX_RECORD_BYTES = 256 * 1024
MAX_MODELS = 4096
MAX_RUNNING = 4096  # tasks one worker runs at once


class RecordError(CompassInputError):
    """A worker record in Redis is not valid; the message names the problem."""


def encode_record(view: WorkerView, **extra: Any) -> str:
    """JSON for one worker's record (backlog and pending live in their own hashes)."""
    body = {
        "name": view.name,
        "queue": view.queue,
        "device": view.device,
        "gpu_total_mb": view.gpu_total_mb,
        "gpu_free_mb": view.gpu_free_mb,
        "resident": sorted(view.resident),
        "host_resident": sorted(view.host_resident),
        "speed": view.speed,
        "load_mb_per_s": view.load_mb_per_s,
        "host_load_mb_per_s": view.host_load_mb_per_s,
        "net_mb_per_s": view.net_mb_per_s,
        "heartbeat": view.heartbeat,
    }
    if view.hop_ms:  # absent until learned: a worker that ran nothing keeps its old bytes
        body["hop_ms"] = view.hop_ms
    if view.served:  # absent when empty: a worker that served nothing keeps its old bytes
        body["served"] = {m: [d.ms_per_s, d.per_s] for m, d in sorted(view.served.items())}
        urgent = {m: d.urgent_per_s for m, d in sorted(view.served.items()) if d.urgent_per_s}
        if urgent:  # the part jobs with a deadline asked for (absent when none)
            body["served_urgent"] = urgent
    if view.loading:  # absent when no load is under way
        body["loading"] = {m: list(span) for m, span in sorted(view.loading.items())}
    if view.running:  # absent when nothing runs
        body["running"] = [list(span) for span in view.running]
    body.update(extra)
    return json.dumps(body, separators=(",", ":"))


def _number(body: Mapping[str, Any], key: str, who: str, *, positive: bool = False) -> float:
    if key not in body:
        raise RecordError(f"worker record {who!r}: missing field {key!r}")
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"worker record {who!r}: field {key!r} must be a finite number, "
                          f"got {value!r:.60}")
    if value < 0 or (positive and value == 0):
        raise RecordError(f"worker record {who!r}: field {key!r} must be "
                          f"{'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


#: Model-name sets already decoded, by their names: a record decoded again usually holds
#: the same models, and the same set object lets the planner skip comparing them.
_SETS: dict[tuple[str, ...], frozenset[str]] = {}
_SETS_MAX = 4096


def _names(body: Mapping[str, Any], key: str, who: str) -> frozenset[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_MODELS or not all(
            isinstance(v, str) for v in value):
        raise RecordError(f"worker record {who!r}: field {key!r} must be a list of model names")
    names = tuple(value)
    hit = _SETS.get(names)
    if hit is None:
        if len(_SETS) >= _SETS_MAX:
            _SETS.clear()
        hit = _SETS[names] = frozenset(names)
    return hit


def _pairs(body: Mapping[str, Any], key: str, who: str, what: str
           ) -> dict[str, tuple[float, float]]:
    """``{"model": [x, y]}`` of finite numbers >= 0 under ``key`` (``what`` names the pair
    in the error)."""
    value = body.get(key, {})
    bad = f"worker record {who!r}: field {key!r} must map model names to " \
          f"{what} pairs of finite numbers >= 0"
    if not isinstance(value, dict) or len(value) > MAX_MODELS:
        raise RecordError(f"{bad}, got {value!r:.60}")
    out: dict[str, tuple[float, float]] = {}
    for model, pair in value.items():
        if not isinstance(pair, list) or len(pair) != 2 or not all(
                not isinstance(v, bool) and isinstance(v, (int, float))
                and math.isfinite(v) and v >= 0 for v in pair):
            raise RecordError(f"{bad}; model {model!r:.60} has {pair!r:.60}")
        out[model] = (float(pair[0]), float(pair[1]))
    return out


def _served(body: Mapping[str, Any], who: str) -> dict[str, ModelDemand]:
    """``{"model": [ms_per_s, per_s]}``: the demand the worker served lately (optional)."""
    urgent = body.get("served_urgent", {})
    if not isinstance(urgent, dict) or not all(
            not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            and v >= 0 for v in urgent.values()):
        raise RecordError(f"worker record {who!r}: field 'served_urgent' must map model "
                          f"names to finite numbers >= 0, got {urgent!r:.60}")
    return {m: ModelDemand(*pair, float(urgent.get(m, 0.0)))
            for m, pair in _pairs(body, "served", who, "[ms_per_s, per_s]").items()}


def _loading(body: Mapping[str, Any], who: str) -> dict[str, tuple[float, float]]:
    """``{"model": [began, ends]}``: loads under way, wall-clock s (optional)."""
    spans = _pairs(body, "loading", who, "[began, ends]")
    for model, (began, ends) in spans.items():
        if ends < began:
            raise RecordError(f"worker record {who!r}: field 'loading': model {model!r:.60} "
                              f"ends ({ends!r}) before it began ({began!r})")
    return spans


def _running(body: Mapping[str, Any], who: str) -> tuple[tuple[float, float, float], ...]:
    """``[[began, ends, charge_ms], ...]``: tasks running now, wall-clock s and ms
    (optional)."""
    value = body.get("running", [])
    bad = f"worker record {who!r}: field 'running' must be a list of [began, ends, " \
          "charge_ms] triples of finite numbers >= 0"
    if not isinstance(value, list) or len(value) > MAX_RUNNING:
        raise RecordError(f"{bad}, got {value!r:.60}")
    out = []
    for span in value:
        if not isinstance(span, list) or len(span) != 3 or not all(
                not isinstance(v, bool) and isinstance(v, (int, float))
                and math.isfinite(v) and v >= 0 for v in span):
            raise RecordError(f"{bad}; got {span!r:.60}")
        if span[1] < span[0]:
            raise RecordError(f"worker record {who!r}: field 'running': a task ends "
                              f"({span[1]!r}) before it began ({span[0]!r})")
        out.append((float(span[0]), float(span[1]), float(span[2])))
    return tuple(out)


def decode_record(raw: bytes | str, *, field_name: str = "?") -> WorkerView:
    """Decode and validate one record; ``field_name`` is the hash field it came from."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_RECORD_BYTES:
            raise RecordError(f"worker record {field_name!r}: {len(raw)} bytes is too large")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"worker record {field_name!r}: not UTF-8 ({exc})") from None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"worker record {field_name!r}: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise RecordError(f"worker record {field_name!r}: expected a JSON object, "
                          f"got {type(body).__name__}")
    name, queue = body.get("name"), body.get("queue")
    if not isinstance(name, str) or not name:
        raise RecordError(f"worker record {field_name!r}: field 'name' must be a non-empty string")
    if name != field_name and field_name != "?":
        raise RecordError(f"worker record {field_name!r}: names a different worker {name!r}")
    if not isinstance(queue, str) or not queue:
        raise RecordError(f"worker record {name!r}: field 'queue' must be a non-empty string")
    device = body.get("device", "cpu")
    if not isinstance(device, str):
        raise RecordError(f"worker record {name!r}: field 'device' must be a string")
    total, free, speed, load, host_load, net, beat = _numbers(body, name)
    return WorkerView(
        name=name,
        queue=queue,
        device=device,
        gpu_total_mb=total,
        gpu_free_mb=min(free, total),
        resident=_names(body, "resident", name),
        host_resident=_names(body, "host_resident", name),
        speed=speed,
        load_mb_per_s=load,
        host_load_mb_per_s=host_load,
        net_mb_per_s=net,
        heartbeat=beat,
        served=_served(body, name) if "served" in body else {},
        hop_ms=_number(body, "hop_ms", name) if "hop_ms" in body else 0.0,
        loading=_loading(body, name) if "loading" in body else {},
        running=_running(body, name) if "running" in body else (),
    )


def judge_record(name: str, raw: bytes | str, queue_prefix: str | None) -> WorkerView | str:
    """Worker ``name``'s record (``raw``, its hash field's value) as a view, or why a reader
    skips it: garbled, or naming a queue other than ``queue_prefix + name`` (forged or
    misconfigured: it would send work, or recovery, to somebody else's queue). Every
    reader judges a record here, once per distinct ``raw``."""
    try:
        view = decode_record(raw, field_name=name)
    except RecordError as exc:
        return str(exc)
    if queue_prefix is not None and view.queue != queue_prefix + view.name:
        return (f"worker record {name!r} names queue {view.queue!r}, not "
                f"{queue_prefix + view.name!r} (forged or misconfigured): ignored, "
                "and its queue is never drained")
    return view


def dead_reason(name: str, age_s: float | None) -> str:
    """Why worker ``name`` (a well-formed record) is skipped as dead: it has no heartbeat
    (``age_s`` None) or its last one is ``age_s`` seconds old, past the timeout."""
    if age_s is None:
        return f"worker {name!r}: no heartbeat (dead)"
    return f"worker {name!r}: heartbeat {age_s:.1f}s old (dead)"


def _learned(raw: Any, name: str) -> tuple[float | None, int]:
    """A learned value's number under ``name`` and its count of observations; (None, 0)
    when there is none or it is unusable."""
    try:
        body = json.loads(raw)
        value, n = float(body[name]), int(body.get("n") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, 0
    return (value, n) if math.isfinite(value) else (None, 0)


def parse_profile(raw: Any) -> float | None:
    """A learned run time (JSON ``{"exec_ms", "n"}``) in ms, or None when unusable."""
    ms = _learned(raw, "exec_ms")[0]
    return ms if ms is not None and ms >= 0 else None


def parse_plan_error(raw: Any) -> float | None:
    """A learned plan error (JSON ``{"error_ms", "n"}``) in ms, or None when unusable."""
    return _learned(raw, "error_ms")[0]


def next_profile(raw: Any, ms: float, alpha: float) -> str:
    """A profile (``raw``, None for none) after one measured run: needs.learn_run_ms."""
    learned, n = _learned(raw, "exec_ms")
    learned = learned if learned is not None and learned >= 0 else None
    return json.dumps({"exec_ms": learn_run_ms(learned, ms, alpha), "n": n + 1})


def next_plan_error(raw: Any, error_ms: float, tau: float, step_ms: float) -> str:
    """A learned plan error (``raw``, None for none: 0) after one job's error:
    planner.admission.plan_error_step."""
    q, n = _learned(raw, "error_ms")
    return json.dumps({"error_ms": plan_error_step(q or 0.0, error_ms, tau, step_ms),
                       "n": n + 1})


def decode_ms(raw: bytes | str | None) -> float:
    """A backlog/pending counter; garbage or negatives read as 0 (never below zero)."""
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


#: The record's numbers in :func:`_numbers`'s order, and whether each must be > 0.
_NUMBERS = (("gpu_total_mb", False), ("gpu_free_mb", False), ("speed", True),
            ("load_mb_per_s", True), ("host_load_mb_per_s", True), ("net_mb_per_s", True),
            ("heartbeat", False))


def _numbers(body: Mapping[str, Any], who: str) -> list[float]:
    """The record's numbers, checked in one pass when they are all fine (a reader decodes
    every changed record on every read); field by field, for the error, when one is not."""
    try:
        values = [body[key] for key, _ in _NUMBERS]
    except KeyError:
        values = []
    ok = len(values) == len(_NUMBERS)
    for v in values:
        if (type(v) is not float and type(v) is not int) or not 0 <= v < math.inf:
            ok = False
            break
    if ok and min(values[2:6]) > 0:  # speed and the three bandwidths
        return [float(v) for v in values]
    return [_number(body, key, who, positive=positive) for key, positive in _NUMBERS]
