"""Every ``compass_*`` setting in one declared table, like celery.app.defaults.

``Compass(app)`` reads settings only through :func:`resolve`, so each name,
default, unit and meaning lives here and nowhere else; ``compass status``
prints the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SettingsError(ValueError):
    """A ``compass_*`` setting has a wrong type or value."""


@dataclass(frozen=True)
class Option:
    default: Any
    type: type | tuple[type, ...]
    doc: str
    unit: str = ""
    minimum: float | None = None


OPTIONS: dict[str, Option] = {
    "redis_url": Option(None, (str, type(None)), "Redis for worker state and jobs; "
                        "defaults to the broker URL when that is Redis"),
    "sentinel_master": Option(None, (str, type(None)), "master name for a sentinel:// "
                              "state URL (default: broker_transport_options['master_name'])"),
    "key_prefix": Option("compass", str, "prefix of every Redis key, so apps can share a Redis"),
    "policy": Option("compass", str, "placement policy (compass, heft, jsq, round-robin, "
                     "random, hash, celery-default)"),
    "seed": Option(0, int, "seed for randomised policies"),
    "state_refresh_s": Option(0.25, (int, float), "worker record publish interval", "s", 0.01),
    "snapshot_ttl_s": Option(0.05, (int, float), "how long a reader reuses a snapshot", "s", 0.0),
    "heartbeat_timeout_s": Option(5.0, (int, float), "a worker older than this is dead",
                                  "s", 0.05),
    "reconcile_s": Option(5.0, (int, float), "backlog reconciliation interval", "s", 0.05),
    "queue_prefix": Option("compass.w.", str, "prefix of each worker's own queue"),
    "shared_queue": Option("compass.shared", str,
                           "fallback queue every Compass worker consumes"),
    "default_exec_ms": Option(100.0, (int, float), "run time of a task nobody declared or "
                              "measured", "ms", 0.0),
    "ewma_alpha": Option(0.3, (int, float), "weight of a new run in the learned run time",
                         "", 0.0),
    "models": Option({}, dict, "model catalogue: name -> size in MB (the registry adds more)"),
    "gpu": Option(None, (str, type(None)), "worker device: 'cuda', 'cuda:N' or 'cpu' "
                  "(default: cuda when present, else cpu)"),
    "emulate_gpu_mb": Option(None, (int, float, type(None)),
                             "emulate a GPU of this capacity instead of using torch", "MB", 1.0),
    "emulate_host_mb": Option(0.0, (int, float), "host-RAM tier of an emulated GPU (evicted "
                              "models reload at host_load_mb_per_s); 0 = none", "MB", 0.0),
    "load_mb_per_s": Option(1500.0, (int, float), "model load bandwidth (emulated GPU; "
                            "initial estimate for a real one)", "MB/s", 1e-6),
    "host_load_mb_per_s": Option(12000.0, (int, float), "host RAM to GPU bandwidth", "MB/s",
                                 1e-6),
    "net_mb_per_s": Option(1000.0, (int, float), "network bandwidth between workers",
                           "MB/s", 1e-6),
    "speed": Option(1.0, (int, float), "speed factor of this worker's GPU (2 = twice as fast)",
                    "", 1e-6),
    "time_scale": Option(1.0, (int, float), "real seconds per workload second for emulated "
                         "sleeps", "", 1e-6),
    "preload": Option([], (list, tuple, str), "models to load at worker start"),
    "cache_policy": Option("lookahead", str, "eviction policy: lookahead, lru or fifo"),
    "prefetch_depth": Option(3, int, "queued tasks to look ahead when prefetching", "", 0),
    "move_factor": Option(1.5, (int, float), "re-place a successor when its worker's backlog "
                          "exceeds this times its run time", "", 0.0),
    "job_ttl_s": Option(3600, (int, float), "expiry of job records and outputs", "s", 1.0),
    "job_timeout_s": Option(600, (int, float), "a job not finished by then fails", "s", 0.01),
    "max_dag_nodes": Option(1000, int, "largest DAG accepted", "", 1),
    "max_output_kb": Option(16384, (int, float), "largest task output stored for a job",
                            "KB", 0.0),
    "validate": Option(False, bool, "check every plan's invariants (costly; on in tests)"),
}


def resolve(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Read every ``compass_*`` setting from ``conf``, typed and checked."""
    out: dict[str, Any] = {}
    for name, opt in OPTIONS.items():
        value = conf.get(f"compass_{name}", None)
        if value is None:
            value = opt.default
        if value is not None and not isinstance(value, opt.type):
            raise SettingsError(
                f"compass_{name} must be {_type_name(opt.type)}, got {value!r}")
        if isinstance(value, bool) and opt.type in ((int, float),) and name != "validate":
            raise SettingsError(f"compass_{name} must be a number, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SettingsError(f"compass_{name} must be finite, got {value!r}")
            if opt.minimum is not None and value < opt.minimum:
                raise SettingsError(
                    f"compass_{name} must be >= {opt.minimum}{opt.unit and ' ' + opt.unit}, "
                    f"got {value!r}")
        out[name] = value
    if isinstance(out["preload"], str):
        out["preload"] = [m for m in out["preload"].split(",") if m]
    for model, size in out["models"].items():
        if not isinstance(size, (int, float)) or isinstance(size, bool) or not size > 0:
            raise SettingsError(f"compass_models[{model!r}] must be a size in MB > 0, "
                                f"got {size!r}")
    return out


def _type_name(t: type | tuple[type, ...]) -> str:
    types = t if isinstance(t, tuple) else (t,)
    return " or ".join("None" if x is type(None) else x.__name__ for x in types)


def describe(values: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Rows of (setting, value, doc) for ``compass status``."""
    return [(f"compass_{n}", repr(values.get(n)), o.doc + (f" [{o.unit}]" if o.unit else ""))
            for n, o in OPTIONS.items()]
