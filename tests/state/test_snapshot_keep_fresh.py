"""Keeping a snapshot fresh between decisions: a process that decided within
``keep_fresh_s`` has its snapshot re-read in the background as it turns ``ttl_s`` old, so
a web process between requests never waits for Redis; one idle for longer stops reading."""

from __future__ import annotations

import threading
import time

from compass_celery.state.reader import SnapshotReader
from tests.state.test_snapshot_reader import GatedStore, view, wait_for

TTL, AHEAD = 0.05, 0.05


def make(keep_fresh_s: float) -> tuple[GatedStore, SnapshotReader]:
    store = GatedStore()
    store.publish(view("a"))
    reader = SnapshotReader(store, ttl_s=TTL, heartbeat_timeout_s=1e12,
                            refresh_ahead_s=AHEAD, keep_fresh_s=keep_fresh_s)
    return store, reader


def test_a_process_in_use_decides_on_fresh_state_without_waiting():
    store, reader = make(keep_fresh_s=2.0)
    reader.get()  # the first read is the caller's
    here = threading.current_thread().name
    assert store.threads == [here]
    store.publish(view("b"))
    time.sleep(0.3)  # longer than TTL + read-ahead: without keeping fresh, this would read
    snap = reader.get()
    assert [w.name for w in snap.workers] == ["a", "b"]  # the change is already in
    assert time.time() - snap.taken_at <= TTL + 0.05  # and the state is fresh
    assert store.threads.count(here) == 1  # no decision read: the reader's thread did
    assert reader.background_reads >= 3
    assert set(store.threads[1:]) == {"compass-snapshot"}


def test_an_idle_process_stops_reading_and_reads_first_when_used_again():
    store, reader = make(keep_fresh_s=0.2)
    reader.get()
    time.sleep(0.4)  # past keep_fresh_s: the background reads stop
    settled = reader.background_reads
    assert settled >= 1
    time.sleep(0.3)
    assert reader.background_reads == settled
    store.publish(view("b"))
    assert [w.name for w in reader.get().workers] == ["a", "b"]  # read first, here
    assert store.threads[-1] == threading.current_thread().name
    wait_for(lambda: reader.background_reads > settled)  # and kept fresh again


def test_keeping_fresh_backs_off_while_the_store_is_down():
    store, reader = make(keep_fresh_s=5.0)
    reader.retry_after_s = 0.1
    reader.get()
    store.fail = True
    before = len(store.threads)
    time.sleep(0.5)
    attempts = len(store.threads) - before
    assert 2 <= attempts <= 7  # about one per retry_after_s, not a tight loop
    store.fail = False
    good = reader.background_reads
    wait_for(lambda: reader.background_reads > good)  # back within about retry_after_s
    assert time.time() - reader.get().taken_at <= TTL + 0.1


def test_off_by_default_an_idle_reader_is_not_read_for():
    store = GatedStore()
    store.publish(view("a"))
    reader = SnapshotReader(store, ttl_s=TTL, heartbeat_timeout_s=1e12, refresh_ahead_s=AHEAD)
    reader.get()
    time.sleep(0.3)
    assert reader.background_reads == 0
    assert len(store.threads) == 1


def test_with_no_ttl_nothing_is_read_ahead_of_the_decisions():
    store = GatedStore()
    store.publish(view("a"))
    reader = SnapshotReader(store, ttl_s=0.0, heartbeat_timeout_s=1e12, keep_fresh_s=5.0)
    for _ in range(3):
        reader.get()  # every get reads, in the caller's thread
    time.sleep(0.2)
    assert reader.background_reads == 0
    assert len(store.threads) == 3
