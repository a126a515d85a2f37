"""The incremental reader's mirror of the state in Redis.

:class:`compass_celery.state.store.RedisStateStore` uses what is here. Every write (publish,
counter, remove, learned run time) bumps a version and logs the
changed member in a change log (``lua/changelog.lua``). A reader keeps a mirror of the
state (decoded records, beats, counters, profiles) and refreshes it with one script
call (``lua/snapshot.lua``): nothing but a few numbers when nothing changed, the
changed members otherwise, everything when it must (new reader, Redis lost its data,
reconnect, fell off the log). Liveness stays exact on every read: the script returns the
beats older than the timeout on Redis's clock, so no read needs every worker's beat.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..planner.cost import evolve
from ..planner.types import WorkerView
from .connection import text
from .keys import split_member
from .records import dead_reason, decode_ms, judge_record, parse_plan_error, parse_profile

#: Members the change log keeps (about 80 bytes each): a reader that misses more changes
#: than this between two reads reads everything again.
CHANGE_LOG_SIZE = 20_000


def epoch_candidate() -> str:
    """A fresh random epoch candidate; only a write into an empty Redis uses it."""
    return os.urandom(8).hex()


def pairs(flat: Sequence[Any]) -> dict[str, Any]:
    """A flat field/value reply as a dict with text keys."""
    return {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _nest(table: dict[str, dict[Any, Any]], member: str, value: Any, inputs: bool) -> str:
    """Set (``value`` None: drop) one QUEUED member (``inputs``: a FORMING member) in
    ``table`` (worker -> level or batch key -> ms or count); nothing and none left out.
    Returns the member's worker."""
    worker, part = split_member(member)
    if not inputs and not part.lstrip("-").isdigit():
        return worker  # not a level: nothing this reader knows
    sub: Any = part if inputs else int(part)
    amount = decode_ms(value)
    amount = round(amount) if inputs else amount
    got = table.get(worker)
    if amount > 0:
        table[worker] = {**(got or {}), sub: amount}  # new dicts: views keep theirs
    elif got is not None and sub in got:
        rest = {k: v for k, v in got.items() if k != sub}
        if rest:
            table[worker] = rest
        else:
            del table[worker]
    return worker


def queued_by_worker(flat: dict[str, Any]) -> dict[str, dict[int, float]]:
    """QUEUED members as worker -> priority level -> ms queued (none left out)."""
    table: dict[str, dict[int, float]] = {}
    for member, value in flat.items():
        _nest(table, member, value, inputs=False)
    return table


def inputs_by_worker(flat: dict[str, Any]) -> dict[str, dict[str, int]]:
    """FORMING members as worker -> batch key -> inputs waiting (none left out)."""
    table: dict[str, dict[str, int]] = {}
    for member, value in flat.items():
        _nest(table, member, value, inputs=True)
    return table


def planned_by_worker(flat: Sequence[Any]) -> dict[str, dict[str, float]]:
    """PLANNED_LOADS' member/end pairs as worker -> model -> when the load ends (unix s);
    a pair that is not a worker, a model and a finite number is skipped."""
    table: dict[str, dict[str, float]] = {}
    for i in range(0, len(flat) - 1, 2):
        worker, model = split_member(text(flat[i]))
        try:
            ends = float(flat[i + 1])
        except (TypeError, ValueError):
            continue
        if worker and model and math.isfinite(ends):
            table.setdefault(worker, {})[model] = ends
    return table


class StateMirror:
    """One process's copy of the cluster state, kept current from the change log.

    The assembled view of each live worker (backlog, pending and heartbeat folded in)
    is kept too, so a read rebuilds only the workers that changed and the tuple of
    live workers is rebuilt only when one of them did.
    """

    def __init__(self, queue_prefix: str | None) -> None:
        self.queue_prefix = queue_prefix
        self.epoch: Any = None
        self.version = -1  # -1: the next read reads everything
        self.records: dict[str, Any] = {}
        self.decoded: dict[str, tuple[Any, WorkerView | str]] = {}  # raw -> view or why not
        self.beats: dict[str, float] = {}  # Redis TIME of the last beat this mirror saw
        self.backlog: dict[str, float] = {}
        self.queued: dict[str, dict[int, float]] = {}  # worker -> level -> ms (QUEUED)
        self.inputs: dict[str, dict[str, int]] = {}  # worker -> batch key -> n (FORMING)
        self.pending: dict[str, float] = {}
        self.pending_queued: dict[str, dict[int, float]] = {}  # worker -> level -> ms
        self.profiles: dict[str, float] = {}
        self.plan_errors: dict[str, float] = {}  # SLO class -> ms
        self.stale: dict[str, float] = {}  # beats older than the timeout at the last read
        self.live: dict[str, WorkerView] = {}
        self.order: list[str] = []
        self.position: dict[str, int] = {}  # name -> index in order (and workers)
        self.workers: tuple[WorkerView, ...] = ()
        self.refused: dict[str, str] = {}
        # worker -> model -> when its planned load ends (unix s): the loads producers
        # planned that were not over at the last read (PLANNED_LOADS, read whole)
        self.planned: dict[str, dict[str, float]] = {}
        self.no_beat: set[str] = set()
        self.full_reads = self.records_fetched = self.own_skipped = 0
        # Counter changes this process made itself, as counters.lua returned them:
        # member -> (epoch, version, value). A read asks Redis to leave out a member whose
        # latest change is still that one, and takes the value from here instead.
        self.own: dict[str, tuple[str, int, Any]] = {}
        self._synced = self._full_at = float("-inf")  # monotonic time of the last ones
        self._cursor = ""  # where the pass over the beats is ('': none under way)

    def note_own(self, member: str, reply: Any) -> None:
        """Remember a counter change this process made (``counters.lua``'s reply for it:
        value, version, epoch): the next read need not fetch it back. Called from any
        thread (one dict store)."""
        if isinstance(reply, (list, tuple)) and len(reply) == 3 and reply[1]:
            self.own[member] = (text(reply[2]), int(reply[1]), reply[0])

    def _take_own(self) -> tuple[dict[str, tuple[str, int, Any]], str]:
        """This mirror's own changes in its epoch, and the ARGV line list naming them."""
        own, self.own = self.own, {}
        epoch = text(self.epoch or "")
        own = {m: o for m, o in own.items() if o[0] == epoch}
        return own, "\n".join(f"{m}\t{o[1]}" for m, o in own.items())

    def reset(self) -> None:
        """Forget the log position: the next read reads everything (decodings are kept)."""
        self.version = -1

    def read(self, call: Callable[[list[Any]], Any], timeout_s: float, now: float,
             beat_sync_s: float, full_read_s: float) -> tuple[Any, ...]:
        """Bring the mirror up to date with one ``snapshot.lua`` call (``call(args)``;
        two when records came or went behind the log); returns :meth:`assemble`'s parts."""
        clock = time.monotonic()
        if clock - self._full_at >= full_read_s:
            self.reset()
        if not self._cursor and clock - self._synced >= beat_sync_s:
            self._cursor = "0"  # start a pass over the beats, a slice per read
        dirty: set[str] = set()
        own, own_arg = self._take_own()
        for _attempt in range(2):
            mine = self.version
            epoch, version, redis_now, kind, count, stale, beats, body, planned = call(
                [text(self.epoch or ""), mine, timeout_s, self._cursor,
                 own_arg if mine >= 0 else ""])
            self.planned = planned_by_worker(planned)
            kind, redis_now = text(kind), float(redis_now)
            if kind == "full":
                dirty |= self.load(*(pairs(part) for part in body))
                self.full_reads += 1
                self.records_fetched += len(self.records)
                self._full_at = clock
            else:
                dirty |= self.apply(body)
                self.records_fetched += sum(1 for i in range(0, len(body), 3)
                                            if text(body[i]).startswith("w:"))
                if own and kind == "delta":
                    dirty |= self.apply_own(own, mine, {text(body[i])
                                                        for i in range(0, len(body), 3)})
            if beats is not None:
                dirty |= self.take_beats(beats[1], every=kind == "full")
                self._cursor = "" if kind == "full" else text(beats[0])
                if self._cursor in ("", "0"):
                    self._cursor, self._synced = "", clock
            self.epoch, self.version = epoch, int(version)
            if len(self.records) == int(count) or kind == "full":
                break
            self.reset()  # records came or went without a logged change: read everything
        stale_beats = {text(stale[i]): float(stale[i + 1]) for i in range(0, len(stale), 2)}
        if self.stale.keys() - stale_beats.keys():
            self._synced = float("-inf")  # beating again: learn its new beat next read
        return self.assemble(dirty, stale_beats, now, redis_now)

    def load(self, records: dict[str, Any], backlog: dict[str, Any], pending: dict[str, Any],
             profiles: dict[str, Any], queued: dict[str, Any], forming: dict[str, Any],
             plan_errors: dict[str, Any], pending_queued: dict[str, Any]) -> set[str]:
        """Replace everything with a full read; returns every worker name to re-check."""
        dirty = set(self.records) | set(records) | set(self.live)
        self.records = records
        self.decoded = {n: v for n, v in self.decoded.items() if n in records}
        self.backlog = {n: decode_ms(v) for n, v in backlog.items()}
        self.queued = queued_by_worker(queued)
        self.inputs = inputs_by_worker(forming)
        self.pending = {n: decode_ms(v) for n, v in pending.items()}
        self.pending_queued = queued_by_worker(pending_queued)
        self.profiles = {k: ms for k, ms in ((k, parse_profile(v)) for k, v in profiles.items())
                         if ms is not None}
        self.plan_errors = {k: ms for k, ms in ((k, parse_plan_error(v))
                                                for k, v in plan_errors.items())
                            if ms is not None}
        return dirty

    def apply(self, body: Sequence[Any]) -> set[str]:
        """Apply changed members ``[member, value, beat, ...]``; returns workers to re-check."""
        dirty: set[str] = set()
        profiles: dict[str, float] | None = None
        for i in range(0, len(body), 3):
            member, value = text(body[i]), body[i + 1]
            kind, name = member[:1], member[2:]
            if kind == "w":
                if value is None:
                    self.records.pop(name, None)
                    self.beats.pop(name, None)
                else:
                    self.records[name] = value
                    if body[i + 2] is None:
                        self.beats.pop(name, None)
                    else:
                        self.beats[name] = float(body[i + 2])
            elif kind in ("b", "p"):
                table = self.backlog if kind == "b" else self.pending
                if value is None:
                    table.pop(name, None)
                else:
                    table[name] = decode_ms(value)
            elif kind in ("q", "i", "r"):
                table = {"q": self.queued, "i": self.inputs, "r": self.pending_queued}[kind]
                name = _nest(table, name, value, inputs=kind == "i")
            elif kind == "f":
                profiles = dict(self.profiles) if profiles is None else profiles
                ms = None if value is None else parse_profile(value)
                if ms is None:
                    profiles.pop(name, None)
                else:
                    profiles[name] = ms
                continue
            elif kind == "e":  # a new dict: snapshots already handed out keep theirs
                error = None if value is None else parse_plan_error(value)
                self.plan_errors = {k: v for k, v in self.plan_errors.items() if k != name}
                if error is not None:
                    self.plan_errors[name] = error
                continue
            dirty.add(name)
        if profiles is not None:
            self.profiles = profiles  # a new dict: snapshots already handed out keep theirs
        return dirty

    def apply_own(self, own: dict[str, tuple[str, int, Any]], mine: int,
                  fetched: set[str]) -> set[str]:
        """Take the values of this process's own changes that the read left out: those
        made after the last read (``mine``) and not fetched, since a member is left out
        only while its latest change is the one this process made. Returns the workers."""
        skipped = [(m, value) for m, (_e, v, value) in own.items()
                   if v > mine and m not in fetched]
        self.own_skipped += len(skipped)
        return self.apply([x for m, value in skipped for x in (m, value, None)])

    def take_beats(self, flat: Sequence[Any], every: bool) -> set[str]:
        """Take beats from a flat name/score list (``every``: all of them, so any other
        is gone); returns the workers whose beat moved."""
        beats = {text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}
        old = self.beats
        self.beats = beats if every else {**old, **beats}
        names = set(old) | set(beats) if every else set(beats)
        return {n for n in names if old.get(n) != beats.get(n)}

    def _view(self, name: str) -> WorkerView | str:
        """The decoded record of ``name`` (decoded again only when its bytes changed), or
        why it is refused."""
        raw = self.records[name]
        hit = self.decoded.get(name)
        if hit is not None and hit[0] == raw:
            return hit[1]
        view = judge_record(name, raw, self.queue_prefix)
        self.decoded[name] = (raw, view)
        return view

    def assemble(self, dirty: set[str], stale: dict[str, float], now: float,
                 redis_now: float) -> tuple[tuple[WorkerView, ...], dict[str, float],
                                            tuple[str, ...], tuple[tuple[str, str], ...],
                                            dict[str, float]]:
        """Re-check the ``dirty`` workers and those whose staleness changed; returns a
        snapshot's live workers, profiles, skipped reasons, dead (name, queue) and plan
        errors."""
        dirty |= set(stale).symmetric_difference(self.stale)
        self.stale = stale
        for name, score in stale.items():
            if self.beats.get(name) != score:
                self.beats[name] = score
                dirty.add(name)
        members_changed = False
        changed: list[str] = []
        offset = now - redis_now  # a beat on Redis's clock as a time on this host's clock
        for name in dirty:
            self.refused.pop(name, None)
            self.no_beat.discard(name)
            view = self._view(name) if name in self.records else None
            if isinstance(view, str):
                self.refused[name] = view
                view = None
            elif view is not None:
                beat = self.beats.get(name)
                if beat is None:
                    self.no_beat.add(name)
                    view = None
                elif name in stale:
                    view = None
                else:
                    view = evolve(view, heartbeat=min(now, beat + offset),
                                  backlog_ms=self.backlog.get(name, 0.0),
                                  pending_ms=self.pending.get(name, 0.0),
                                  pending_queued_ms=self.pending_queued.get(name, {}),
                                  queued_ms=self.queued.get(name, {}),
                                  queued_inputs=self.inputs.get(name, {}))
            if view is None:
                if self.live.pop(name, None) is not None:
                    members_changed = True
            else:
                if name not in self.live:
                    members_changed = True
                self.live[name] = view
                changed.append(name)
        if members_changed:
            self.order = sorted(self.live)
            self.position = {n: i for i, n in enumerate(self.order)}
            self.workers = tuple(map(self.live.__getitem__, self.order))
        elif changed:  # the same workers: rewrite only the changed positions
            workers = list(self.workers)
            for name in changed:
                workers[self.position[name]] = self.live[name]
            self.workers = tuple(workers)
        skipped = [self.refused[n] for n in sorted(self.refused)]
        dead: list[tuple[str, str]] = []
        for name in sorted(self.no_beat | (stale.keys() & self.records.keys())):
            view = self.decoded.get(name, (None, ""))[1]
            if not isinstance(view, WorkerView):
                continue  # refused records are never judged, nor drained
            age = None if name in self.no_beat else max(0.0, redis_now - stale[name])
            skipped.append(dead_reason(name, age))
            dead.append((view.name, view.queue))
        return self.workers, self.profiles, tuple(skipped), tuple(dead), self.plan_errors
