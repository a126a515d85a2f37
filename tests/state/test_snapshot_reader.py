"""The snapshot reader: a busy process plans on its snapshot while a fresh one is read
ahead, an idle one reads before it decides, and a failing read never blocks decisions."""

from __future__ import annotations

import threading
import time

import pytest

from compass_celery.planner.types import WorkerView
from compass_celery.state.connection import StateUnavailable
from compass_celery.state.reader import SnapshotReader
from compass_celery.state.store import MemoryStateStore


def view(name: str, free: float = 500.0) -> WorkerView:
    return WorkerView(name=name, queue="q." + name, gpu_total_mb=1000.0, gpu_free_mb=free,
                      heartbeat=100.0)


class GatedStore(MemoryStateStore):
    """A store whose reads wait for ``gate`` and can be made to fail; it records the
    thread each read ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.threads: list[str] = []

    def snapshot(self, now, heartbeat_timeout_s):
        self.threads.append(threading.current_thread().name)
        if not self.gate.wait(10):
            raise AssertionError("gate never opened")
        if self.fail:
            raise StateUnavailable("Redis at redis://x unavailable: refused")
        return super().snapshot(now, heartbeat_timeout_s)


def wait_for(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


@pytest.fixture
def setup():
    now = [100.0]
    store = GatedStore()
    store.publish(view("a"))
    reader = SnapshotReader(store, ttl_s=0.05, heartbeat_timeout_s=1e12,
                            clock=lambda: now[0], refresh_ahead_s=0.05)
    return now, store, reader


def test_a_busy_reader_plans_on_its_snapshot_while_the_next_is_read_ahead(setup):
    now, store, reader = setup
    first = reader.get()
    charges = HeldCharges(store)
    reader.charges = charges
    store.publish(view("b"))
    store.gate.clear()  # the read ahead will wait here
    now[0] += 0.07  # past the TTL, within the read-ahead window
    assert reader.get() is first  # no waiting: the old snapshot, a read under way
    assert reader.get() is first  # one read ahead at a time
    wait_for(lambda: len(store.threads) == 2)
    assert store.threads[1] == "compass-snapshot"
    store.gate.set()
    wait_for(lambda: reader.background_reads == 1)
    assert [w.name for w in reader.get().workers] == ["a", "b"]
    assert charges.reads == 1  # the read went through the charges
    assert store.threads.count("compass-snapshot") == 1


class HeldCharges:
    """The ChargeBatcher's contract by hand: no charge is written while a read runs; every
    charge not written yet (made before the read or during it) is returned with what was
    read, and written after it."""

    def __init__(self, store: MemoryStateStore) -> None:
        self.store, self.pending, self.reads = store, {}, 0
        self.during: dict[str, float] = {}

    def add(self, member: str, ms: float, table: str = "backlog") -> None:
        self.pending[(table, member)] = self.pending.get((table, member), 0.0) + ms

    def read_through(self, read):
        self.reads += 1
        snap = read()
        held, self.pending = dict(self.pending), {}
        for (table, member), ms in held.items():  # written once the read is done
            self.store.charge(member, ms, table=table)
        return snap, held


def test_charges_made_while_a_read_runs_ahead_count_once(setup):
    now, store, reader = setup
    charges = HeldCharges(store)
    reader.charges = charges
    reader.get()
    for _ in range(3):  # a burst: charged in the snapshot at once, in Redis later
        reader.note_charge("a", 10.0)
        charges.add("a", 10.0)
    store.gate.clear()
    now[0] += 0.07
    reader.get()  # starts the read ahead, which writes the 30 ms first, then waits
    wait_for(lambda: len(store.threads) == 2)
    reader.note_charge("a", 5.0)  # made while the read runs: not in what it reads
    charges.add("a", 5.0)
    store.gate.set()
    wait_for(lambda: reader.background_reads == 1)
    assert reader.get().workers[0].backlog_ms == 35.0  # each charge exactly once
    now[0] += 0.2
    assert reader.get().workers[0].backlog_ms == 35.0  # and so in the store


def test_an_idle_reader_reads_before_it_decides(setup):
    now, store, reader = setup
    reader.get()
    store.publish(view("b"))
    now[0] += 0.2  # idle longer than TTL + read-ahead: the snapshot is too old to use
    assert [w.name for w in reader.get().workers] == ["a", "b"]
    assert store.threads[-1] == threading.current_thread().name
    assert reader.background_reads == 0


def test_a_failed_read_ahead_never_blocks_and_is_reported_past_the_window(setup):
    now, store, reader = setup
    first = reader.get()
    store.fail = True
    now[0] += 0.07
    assert reader.get() is first
    wait_for(lambda: len(store.threads) == 2 and not reader._refreshing)
    assert reader.get() is first  # still inside the window: plan on what we have
    now[0] += 0.05  # past the window: the failure is raised, fast (no new attempt)
    with pytest.raises(StateUnavailable, match="refused"):
        reader.get()
    assert len(store.threads) == 2
    store.fail = False
    now[0] += reader.retry_after_s
    assert [w.name for w in reader.get().workers] == ["a"]


def test_without_read_ahead_a_decision_past_the_ttl_waits_for_the_read():
    now = [100.0]
    store = GatedStore()
    store.publish(view("a"))
    reader = SnapshotReader(store, ttl_s=0.05, heartbeat_timeout_s=1e12, clock=lambda: now[0])
    reader.get()
    store.publish(view("b"))
    now[0] += 0.07
    assert [w.name for w in reader.get().workers] == ["a", "b"]
    assert set(store.threads) == {threading.current_thread().name}


def test_a_decision_past_the_window_takes_the_read_already_under_way(setup):
    now, store, reader = setup
    reader.get()
    store.publish(view("b"))
    store.gate.clear()
    now[0] += 0.07
    reader.get()  # starts the read ahead, held at the gate
    wait_for(lambda: len(store.threads) == 2)
    now[0] += 0.08  # this process got no core for a while: its snapshot is too old
    got = []
    caller = threading.Thread(target=lambda: got.append(reader.get()))
    caller.start()
    time.sleep(0.05)
    assert not got  # waiting for the read under way, not reading again
    store.gate.set()
    caller.join(5)
    assert [w.name for w in got[0].workers] == ["a", "b"]
    assert store.threads.count("compass-snapshot") == 1 and len(store.threads) == 2


def test_a_decision_that_must_not_plan_on_the_past_reads_the_store_now(setup):
    """``max_age_s`` (a job with a deadline: 0) reads the store even inside the TTL, in the
    caller's thread, and sees what changed since; without it the cached snapshot serves."""
    now, store, reader = setup
    first = reader.get()
    store.publish(view("a", free=100.0))  # a worker changed (it took a task)
    now[0] += 0.01  # well inside the TTL
    assert reader.get() is first
    reads = reader.reads
    fresh = reader.get(max_age_s=0.0)
    assert reader.reads == reads + 1 and fresh is not first
    assert store.threads[-1] == threading.current_thread().name
    assert fresh.workers[0].gpu_free_mb == 100.0
    assert reader.get(max_age_s=1.0) is fresh  # young enough: no read
    assert reader.reads == reads + 1
