"""Every ``compass_*`` setting in one declared table, like celery.app.defaults.

``Compass(app)`` reads settings only through :func:`resolve`, so each name,
default, unit and meaning lives here and nowhere else; ``compass status``
prints the table. What it returns is one frozen :data:`CompassSettings` whose
fields are made from the table, and the code reads it by attribute
(``compass.settings.time_scale``).

The Celery settings compass recommends live here too (:data:`CELERY_RECOMMENDED`).
They are decided by the pure function :func:`recommend`: the user's Celery
settings are theirs, so a recommendation fills only what the app left unset,
and a kept value that differs is reported, never overwritten.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from .errors import CompassInputError
from .planner.adjust import DEFAULT_MOVE_FACTOR
from .planner.admission import DEFAULT_HEADROOM, SloError, slo_class
from .planner.types import DEFAULT_HOST_LOAD_MB_PER_S, DEFAULT_LOAD_MB_PER_S, DEFAULT_NET_MB_PER_S
from .state.urls import masked


class SettingsError(CompassInputError):
    """A ``compass_*`` setting has a wrong type or value."""


@dataclass(frozen=True)
class Option:
    """One ``compass_*`` setting: default, accepted types, meaning, unit, lower bound."""

    default: Any
    type: type | tuple[type, ...]
    doc: str
    unit: str = ""
    minimum: float | None = None


OPTIONS: dict[str, Option] = {
    "redis_url": Option(None, (str, type(None)), "Redis for worker state and jobs "
                        "(redis+cluster://host:port[,host:port] for a Redis Cluster); "
                        "defaults to the broker URL when that is Redis"),
    "sentinel_master": Option(None, (str, type(None)), "master name for a sentinel:// "
                              "state URL (default: broker_transport_options['master_name'])"),
    "key_prefix": Option("compass", str, "prefix of every Redis key, so apps can share a Redis"),
    "policy": Option("compass", str, "placement policy (compass, heft, jsq, round-robin, "
                     "random, hash, celery-default)"),
    "seed": Option(0, int, "seed for randomised policies"),
    "state_refresh_s": Option(0.25, (int, float), "worker record publish interval", "s", 0.01),
    "snapshot_ttl_s": Option(0.05, (int, float), "how long a reader reuses a snapshot", "s", 0.0),
    "snapshot_refresh_ahead_s": Option(0.05, (int, float), "how much older than the TTL a "
                                       "busy process's snapshot may get while a fresh one is "
                                       "read in the background (0: a decision past the TTL "
                                       "waits for the read); producers only, workers always "
                                       "read before they re-place", "s", 0.0),
    "snapshot_keep_fresh_s": Option(1.0, (int, float), "for how long after its last "
                                    "decision a producer keeps its snapshot fresh in the "
                                    "background, re-reading it before it is too old to use, "
                                    "so a process deciding now and then never waits for "
                                    "Redis (0: an idle process reads before it decides); "
                                    "producers only", "s", 0.0),
    "heartbeat_timeout_s": Option(30.0, (int, float), "a worker whose last beat (on Redis's "
                                  "clock) is older than this is dead and its queue drained; "
                                  "the default outlasts a Sentinel failover", "s", 0.05),
    "reconcile_s": Option(5.0, (int, float), "backlog reconciliation interval", "s", 0.05),
    "charge_linger_s": Option(0.005, (int, float), "how long a producer gathers backlog "
                              "charges before writing them to Redis in one pipeline", "s", 0.0),
    "queue_prefix": Option(None, (str, type(None)), "prefix of each worker's own queue "
                           "(default '<key_prefix>.w.', so apps with their own key prefix "
                           "share no queue)"),
    "shared_queue": Option(None, (str, type(None)), "fallback queue every Compass worker "
                           "consumes (default '<key_prefix>.shared')"),
    "metrics_port": Option(None, (int, type(None)), "serve Prometheus metrics from each "
                           "worker's main process on this port (needs the metrics extra)",
                           "", 1),
    "submit_retry_s": Option(10.0, (int, float), "how long a Dag submission retries a "
                             "Redis hiccup (restart, pause, failover) before it fails",
                             "s", 0.0),
    "output_cache_mb": Option(256.0, (int, float), "memory a worker spends on recent task "
                              "outputs for collocated successors", "MB", 0.0),
    "default_exec_ms": Option(100.0, (int, float), "run time of a task nobody declared or "
                              "measured", "ms", 0.0),
    "ewma_alpha": Option(0.3, (int, float), "weight of a new run in the learned run time",
                         "", 0.0),
    "models": Option({}, dict, "model catalogue: name -> size in MB (the registry adds more)"),
    "gpu": Option(None, (str, type(None)), "worker device: 'cuda', 'cuda:N' or 'cpu' "
                  "(default: cuda when present, else cpu)"),
    "device_mb": Option(None, (int, float, type(None)), "memory models may take on the "
                        "worker's torch device (cpu: a budget standing in for GPU memory; "
                        "cuda: a cap below the device's own)", "MB", 1.0),
    "emulate_gpu_mb": Option(None, (int, float, type(None)),
                             "emulate a GPU of this capacity instead of using torch", "MB", 1.0),
    "emulate_host_mb": Option(0.0, (int, float), "host-RAM tier of an emulated GPU (evicted "
                              "models reload at host_load_mb_per_s); 0 = none", "MB", 0.0),
    "load_mb_per_s": Option(DEFAULT_LOAD_MB_PER_S, (int, float), "model load bandwidth "
                            "(emulated GPU; initial estimate for a real one)", "MB/s", 1e-6),
    "host_load_mb_per_s": Option(DEFAULT_HOST_LOAD_MB_PER_S, (int, float),
                                 "host RAM to GPU bandwidth", "MB/s", 1e-6),
    "net_mb_per_s": Option(DEFAULT_NET_MB_PER_S, (int, float),
                           "network bandwidth between workers", "MB/s", 1e-6),
    "speed": Option(1.0, (int, float), "speed factor of this worker's GPU (2 = twice as fast)",
                    "", 1e-6),
    "time_scale": Option(1.0, (int, float), "real seconds per workload second for emulated "
                         "sleeps", "", 1e-6),
    "preload": Option([], (list, tuple, str), "models to load at worker start"),
    "torch_threads": Option(None, (int, type(None)), "torch's intra-op threads on a worker "
                            "whose device is cpu (default: its share of the host's cores, "
                            "cores // the CPU workers on the host and their pool processes; "
                            "an exported OMP_NUM_THREADS is kept)", "", 1),
    "cache_policy": Option("lookahead", str, "eviction policy: lookahead, lru or fifo"),
    "prefetch_depth": Option(3, int, "queued tasks to look ahead when prefetching", "", 0),
    "gc_interval_s": Option(60.0, (int, float), "how often a worker runs a full garbage "
                            "collection, between tasks, so its memory stays flat; its "
                            "start-up heap is frozen out of every collection's walk (0: "
                            "neither; Python's own full collections only)", "s", 0.0),
    "prefetch_poll_s": Option(0.05, (int, float), "while a task runs, how often the worker "
                              "peeks its queue for models to load behind it (0: only when a "
                              "task starts)", "s", 0.0),
    "move_factor": Option(DEFAULT_MOVE_FACTOR, (int, float), "re-place a successor when its "
                          "worker's backlog exceeds this times its run time", "", 0.0),
    "job_ttl_s": Option(3600, (int, float), "expiry of job records and outputs", "s", 1.0),
    "job_timeout_s": Option(600, (int, float), "a job not finished by then fails", "s", 0.01),
    "max_dag_nodes": Option(1000, int, "largest DAG accepted", "", 1),
    "max_input_kb": Option(16384, (int, float), "largest input (a node's or a plain "
                           "task's own arguments, as JSON) accepted; checked at send",
                           "KB", 0.0),
    "max_output_kb": Option(16384, (int, float), "largest task output stored for a job; "
                            "checked once the task returns, and against a node's declared "
                            "output_kb at submission", "KB", 0.0),
    "validate": Option(False, bool, "check every plan's invariants (costly; on in tests)"),
    "priority_classes": Option({}, dict, "named priority levels for priority=, added to "
                               "{'interactive': 9, 'batch': 0}; levels run 0 (lowest, the "
                               "default) to 9 (most urgent) on every broker"),
    "priority_age_s": Option(10.0, (int, float), "ageing rule: a task waiting this long is "
                             "promoted one priority level per period, so batch work is never "
                             "starved (0: off; Redis broker)", "s", 0.0),
    "deadline_state_max_age_ms": Option(0.0, (int, float), "how old the workers' state "
                                        "a job with a deadline may be planned on (0: "
                                        "read at its submission, one state read a job)",
                                        "ms", 0.0),
    "hold_max_ms": Option(0.0, (int, float), "held slot: a worker does not start a task "
                          "without a deadline of a lower priority level while a higher "
                          "level's later step is planned on it (a job's successor not yet "
                          "sent), for at most "
                          "this long per hold, so a batch task started just before it does "
                          "not delay it a whole run (0: off; Redis broker; workload ms)",
                          "ms", 0.0),
    "slo_classes": Option({}, dict, "named service objectives for slo=: class -> "
                          "{deadline_ms, on_miss ('reject', 'late' or 'degrade'), priority}, "
                          "added to {'interactive': 400 ms, reject, priority 9; 'batch': no "
                          "deadline, priority 0}"),
    "admission": Option(True, bool, "refuse at submission a job the plan says will miss its "
                        "deadline (off: take it and mark it late)"),
    "admission_headroom": Option(DEFAULT_HEADROOM, (int, float), "share of a deadline "
                                 "admission keeps in reserve for the plan's error: a job is "
                                 "taken when predicted to finish within (1 - this) x its "
                                 "deadline", "", 0.0),
    "count_arrivals": Option(True, bool, "count each submitted job (admitted or refused) "
                             "per SLO class in Redis, per second in one hash a minute "
                             "kept an hour, for an autoscaler controller's arrival rate "
                             "(state/arrivals.py)"),
    "batching": Option(True, bool, "workers run a batched task (compass_batch) with the "
                       "inputs of the same task and model waiting in their queue (off: "
                       "every input runs as a batch of one)"),
    "batch_aware": Option(True, bool, "placement counts the batches forming in workers' "
                          "queues: a batched task may join one, charged only what it adds "
                          "(off: placed as an unbatched task, at its full run time)"),
    "atomic_fetch": Option(True, bool, "Redis broker: a worker takes each message off its "
                           "own and the shared queue in one atomic step, so none is lost to a "
                           "kill between taking and recording it (off: kombu's BRPOP, which "
                           "loses a message handed to a worker killed at that instant)"),
    "max_queue_ms": Option(None, (int, float, type(None)), "refuse a job or task whose "
                           "best worker has more than this much work queued ahead of it "
                           "(a queue bound in time, not messages; None: unbounded)", "ms",
                           0.0),
}


class _SettingsBase(Mapping[str, Any]):
    """What every :class:`CompassSettings` has besides its fields: read by attribute
    (``s.atomic_fetch``); the read-only mapping view (``s["atomic_fetch"]``) is kept for
    users' code, tests and ``describe``, while the package itself reads by attribute only
    (tests/test_settings_keys.py)."""

    def __getitem__(self, name: str) -> Any:
        if name not in OPTIONS:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(OPTIONS)

    def __len__(self) -> int:
        return len(OPTIONS)

    def replace(self, **changes: Any) -> CompassSettings:
        """A copy with ``changes`` (already checked) in place of those fields."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _annotation(t: type | tuple[type, ...]) -> Any:
    """The field type of a declaration's accepted types: ``(int, float)`` -> ``int | float``."""
    types = t if isinstance(t, tuple) else (t,)
    return Union[types] if len(types) > 1 else types[0]  # noqa: UP007


#: The ``compass_*`` settings as one frozen object, read by attribute
#: (``compass.settings.time_scale``). Its fields are made from :data:`OPTIONS`, so each
#: setting is still declared once: field name = setting name without ``compass_``, field
#: type = the declared types. Built only by :func:`resolve` and :func:`with_flags`, after
#: every value is checked; a misspelt attribute is an AttributeError, and assigning one
#: is refused (frozen).
CompassSettings: Any = dataclasses.make_dataclass(
    "CompassSettings", [(name, _annotation(opt.type)) for name, opt in OPTIONS.items()],
    bases=(_SettingsBase,), frozen=True, eq=True)
CompassSettings.__module__ = __name__
CompassSettings.__doc__ = ("The checked ``compass_*`` settings, one field per declaration "
                           "in :data:`OPTIONS` (generated from it).")


def checked(name: str, value: Any, label: str | None = None) -> Any:
    """``value`` for setting ``name`` if its declaration (:data:`OPTIONS`) accepts it;
    else :class:`SettingsError` naming ``label`` (the setting, or the flag it came by),
    the value and what is allowed."""
    opt, label = OPTIONS[name], label or f"compass_{name}"
    if value is not None and not isinstance(value, opt.type):
        raise SettingsError(f"{label} must be {_type_name(opt.type)}, got {value!r}")
    if isinstance(value, bool) and opt.type in ((int, float),):
        raise SettingsError(f"{label} must be a number, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise SettingsError(f"{label} must be finite, got {value!r}")
        if opt.minimum is not None and value < opt.minimum:
            bound = "> 0" if 0 < opt.minimum < 1e-3 else f">= {opt.minimum:g}"
            raise SettingsError(f"{label} must be {bound}{opt.unit and ' ' + opt.unit}, "
                                f"got {value!r}")
    return value


def resolve(conf: Mapping[str, Any], **fixed: Any) -> CompassSettings:
    """Read every ``compass_*`` setting from ``conf``, checked, as one
    :class:`CompassSettings`; ``fixed`` are values the caller decides over the checked
    ones (``batch_aware=False`` where the broker cannot batch)."""
    out: dict[str, Any] = {}
    for name, opt in OPTIONS.items():
        value = conf.get(f"compass_{name}", None)
        out[name] = checked(name, opt.default if value is None else value)
    _split_preload(out)
    if out["queue_prefix"] is None:
        out["queue_prefix"] = f"{out['key_prefix']}.w."
    if out["shared_queue"] is None:
        out["shared_queue"] = f"{out['key_prefix']}.shared"
    for cls, level in out["priority_classes"].items():
        if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 9:
            raise SettingsError(f"compass_priority_classes[{cls!r}] must be a level 0..9 "
                                f"(9 most urgent), got {level!r}")
    if not out["admission_headroom"] < 1:
        raise SettingsError("compass_admission_headroom must be below 1 (a share of the "
                            f"deadline), got {out['admission_headroom']!r}")
    for cls, body in out["slo_classes"].items():
        try:
            slo_class(cls, body)
        except SloError as exc:
            raise SettingsError(f"compass_slo_classes: {exc}") from None
    for model, size in out["models"].items():
        if not isinstance(size, (int, float)) or isinstance(size, bool) or not size > 0:
            raise SettingsError(f"compass_models[{model!r}] must be a size in MB > 0, "
                                f"got {size!r}")
    return CompassSettings(**{**out, **fixed})


def with_flags(values: Mapping[str, Any], flags: Mapping[str, Any]) -> CompassSettings:
    """Resolved settings with a worker's ``--compass-*`` flags over them, each checked as
    its setting is: a bad one (``--compass-speed 0``) is refused at start, naming the flag,
    rather than published in a record every reader drops."""
    out = dict(values)
    for name, value in flags.items():
        out[name] = checked(name, value, f"--compass-{name.replace('_', '-')}")
    _split_preload(out)
    return CompassSettings(**out)


def _split_preload(values: dict[str, Any]) -> None:
    """``preload`` given as 'a,b' (a flag, an environment value) becomes a list."""
    if isinstance(values["preload"], str):
        values["preload"] = [m for m in values["preload"].split(",") if m]


def _type_name(t: type | tuple[type, ...]) -> str:
    types = t if isinstance(t, tuple) else (t,)
    return " or ".join("None" if x is type(None) else x.__name__ for x in types)


def describe(values: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Rows of (setting, value, doc) for ``compass status``."""
    def shown(value: Any) -> str:
        return repr(masked(value) if isinstance(value, str) else value)

    return [(f"compass_{n}", shown(values.get(n)), o.doc + (f" [{o.unit}]" if o.unit else ""))
            for n, o in OPTIONS.items()]


# -- Celery settings compass recommends ------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """A Celery setting compass wants, and why (the why is logged when the user differs)."""

    value: Any
    why: str


CELERY_RECOMMENDED: dict[str, Recommendation] = {
    "worker_prefetch_multiplier": Recommendation(
        1, "messages a worker has prefetched are invisible to its backlog estimate, so "
        "placement would see it idler than it is"),
    "task_acks_late": Recommendation(
        True, "a task acked before it runs is lost when its worker dies; acked late, "
        "compass can re-place it"),
    "task_reject_on_worker_lost": Recommendation(
        True, "a task whose pool process died is redelivered instead of being acked "
        "as failed"),
    "task_serializer": Recommendation(
        "json", "messages cross Redis, which compass shares with its state; JSON is the "
        "format compass is tested with and it cannot run code"),
    "result_serializer": Recommendation(
        "json", "results cross Redis; JSON is the format compass is tested with and it "
        "cannot run code"),
    "accept_content": Recommendation(
        ["json"], "a worker decodes whatever content types it accepts from anyone who can "
        "write to its queues"),
    "result_backend_transport_options": Recommendation(
        {"retry_policy": {"max_retries": 3, "interval_start": 0, "interval_step": 0.2,
                          "interval_max": 0.5}},
        "a result store that cannot be reached makes delay() fail in about a second, not "
        "after Celery's 19 s of retries (nothing is queued when it fails)"),
    # A dict is merged key by key: the user's keys stay, missing ones are added.
    "broker_transport_options": Recommendation(
        {"visibility_timeout": 3600},
        "an unacked message on the shared queue comes back after this many seconds; it "
        "must exceed the longest task or the task runs twice, and a larger value delays "
        "the recovery of a dead worker's shared-queue task (its own queue is drained at "
        "heartbeat timeout)"),
}


class _Missing:
    """Marks a setting the app left unset (``None`` is a value a user can set)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Difference:
    """A user's Celery setting that compass keeps although it recommends another value."""

    setting: str
    user: Any
    recommended: Any
    why: str

    def message(self) -> str:
        """One log line: the setting, both values and the reason."""
        return (f"keeping your Celery setting {self.setting}={self.user!r}; compass "
                f"recommends {self.recommended!r} because {self.why}")


def user_value(conf: Mapping[str, Any], key: str) -> Any:
    """What the app itself set for Celery setting ``key``, or :data:`MISSING`.

    A Celery ``Settings`` chains the app's changes (``conf.update``, ``Celery(**kw)``),
    any ``add_defaults`` layers and the loaded configuration (``config_from_object``,
    ``config_from_envvar``, under its namespace) in front of Celery's built-in defaults,
    which are always the last map. A value in any map but that last one was set by the
    app, by whichever route; Celery's own key aliases (namespace prefix, old names) count.
    A plain mapping counts as set entirely by the user.
    """
    maps = getattr(conf, "maps", None)
    if not isinstance(maps, list):
        return conf.get(key, MISSING)
    to_keys = getattr(conf, "_to_keys", None)
    keys = tuple(to_keys(key)) if callable(to_keys) else (key,)
    user_maps = maps[:-1] if len(maps) > 1 else maps
    for mapping in user_maps:
        for k in keys:
            if k in mapping:
                return mapping[k]
    return MISSING


def _same(a: Any, b: Any) -> bool:
    """Equal by meaning: a list and a tuple of the same items alike, and a set alike with
    any collection of the same members (accept_content)."""
    if isinstance(a, (set, frozenset)) or isinstance(b, (set, frozenset)):
        if isinstance(a, str) or isinstance(b, str):
            return False
        try:
            return set(a) == set(b)
        except TypeError:  # not a collection, or unhashable members
            return False
    if isinstance(a, Sequence) and isinstance(b, Sequence) and not isinstance(a, str) \
            and not isinstance(b, str):
        return list(a) == list(b)
    return bool(a == b)


def recommend(conf: Mapping[str, Any]) -> tuple[dict[str, Any], list[Difference]]:
    """Decide compass's Celery settings against what the app set.

    Returns ``(to_apply, differences)``: the values to write (only where the user set
    nothing; for a dict setting, the user's dict with the missing recommended keys
    added), and one :class:`Difference` per user value that differs from compass's.
    Pure: reads ``conf``, writes nothing.
    """
    to_apply: dict[str, Any] = {}
    differences: list[Difference] = []
    for key, rec in CELERY_RECOMMENDED.items():
        user = user_value(conf, key)
        if user is MISSING:
            to_apply[key] = copy.deepcopy(rec.value)
        elif isinstance(rec.value, dict) and (user is None or isinstance(user, Mapping)):
            user = user or {}
            merged = dict(user)
            for sub, wanted in rec.value.items():
                if sub not in user:
                    merged[sub] = copy.deepcopy(wanted)
                elif not _same(user[sub], wanted):
                    differences.append(Difference(f"{key}[{sub!r}]", user[sub], wanted,
                                                  rec.why))
            if merged != user:
                to_apply[key] = merged
        elif not _same(user, rec.value):
            differences.append(Difference(key, user, rec.value, rec.why))
    return to_apply, differences


PICKLE_NAMES = frozenset({"pickle", "application/x-python-serialize"})
_SERIALIZER_KEYS = ("task_serializer", "result_serializer", "event_serializer")
_ACCEPT_KEYS = ("accept_content", "result_accept_content")


def refuse_pickle(conf: Mapping[str, Any]) -> None:
    """Raise :class:`SettingsError` naming any setting that would encode or accept pickle.

    Messages, results and events cross Redis, and decoding pickle runs code chosen by
    whoever can write there, so compass refuses it by name and by content type.
    """
    for key in _SERIALIZER_KEYS:
        value = conf.get(key)
        if isinstance(value, str) and value.strip().lower() in PICKLE_NAMES:
            raise SettingsError(
                f"{key}={value!r} is refused by compass-celery: messages cross trust "
                "boundaries through Redis and pickle runs code when decoded; use 'json'")
    for key in _ACCEPT_KEYS:
        value = conf.get(key) or ()
        items = value.split(",") if isinstance(value, str) else value
        for item in items:
            if isinstance(item, str) and item.strip().lower() in PICKLE_NAMES:
                raise SettingsError(
                    f"{key} includes {item!r} (pickle), which compass-celery refuses: "
                    "accepting it lets whoever can write to Redis run code; use ['json']")
