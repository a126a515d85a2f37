"""The atomic fetch (fetch.lua) and what recovery reads of it, against a real Redis."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis

from compass_celery.broker.fetch import BELL_TTL_MS, _fetch_script, ring_compass_queues
from compass_celery.broker.kombu_redis import RedisLayout, RedisQueues
from compass_celery.state.scripts import script

pytestmark = pytest.mark.redis

QUEUE, SHARED = "compass.w.f0", "compass.shared"


def _message(queue: str, task_id: str | None = None) -> str:
    tid = task_id or uuid.uuid4().hex
    return json.dumps({"body": "W10=", "headers": {"task": "j.src", "id": tid},
                       "properties": {"delivery_tag": tid, "priority": 0, "delivery_info":
                                      {"exchange": "", "routing_key": queue}}})


def _fetch(client: redis.Redis, queues: RedisQueues, lists: list[str],
           bells: tuple[str, ...] = (), acks: tuple[str, ...] = ()) -> list[bytes] | None:
    return client.eval(_fetch_script(), 3 + len(lists) + len(bells), "unacked",
                       "unacked_index", queues.leases_key, *lists, *bells, "1.0", len(lists),
                       "", "", "", len(acks), *acks)


def test_a_fetched_message_is_in_flight_and_leased_in_the_same_step(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    low, high = layout.list_for(QUEUE, 9), layout.list_for(QUEUE, 0)
    client.lpush(low, _message(QUEUE, "low"))
    client.lpush(high, _message(QUEUE, "high"))
    src, raw = _fetch(client, queues, layout.lists(QUEUE))
    assert src.decode() == high and json.loads(raw)["headers"]["id"] == "high"  # kombu's order
    entry = json.loads(client.hget("unacked", "high"))
    assert entry[1:] == ["", QUEUE] and entry[0]["headers"]["id"] == "high"
    assert client.zscore("unacked_index", "high") == 1.0
    assert client.zscore(queues.leases_key, "high") is not None
    assert json.loads(_fetch(client, queues, layout.lists(QUEUE))[1])["headers"]["id"] == "low"
    assert _fetch(client, queues, layout.lists(QUEUE)) is None


def test_a_look_that_finds_nothing_clears_the_bells_and_one_that_finds_keeps_them(
        compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    bells = (layout.bell(QUEUE), layout.bell(SHARED))
    client.delete(*layout.lists(QUEUE), *layout.lists(SHARED), *bells)
    client.lpush(layout.list_for(SHARED, 0), _message(SHARED, "s"))
    client.lpush(bells[0], "1")
    client.lpush(bells[1], "1")
    lists = [*layout.lists(QUEUE), *layout.lists(SHARED)]
    assert json.loads(_fetch(client, queues, lists, bells)[1])["headers"]["id"] == "s"
    assert client.llen(bells[0]) == 1  # a busy worker looks again anyway
    assert _fetch(client, queues, lists, bells) is None
    assert not client.exists(*bells)  # rung for messages already taken


def test_a_look_reads_a_job_nodes_job_state_with_the_node(compass_redis_url):
    """Named the job header and the record's key, a look returns the job's state with a
    job node ('' once the record is gone), and nothing more with any other message."""
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    lists = layout.lists(QUEUE)
    client.delete(*lists, "compass:job:{j1}")
    client.hset("compass:job:{j1}", "state", "FAILURE")
    for job in ("j1", "gone"):
        node = json.loads(_message(QUEUE, f"{job}.a"))
        node["headers"]["compass_job"] = {"id": job, "node": "a"}
        client.lpush(lists[0], json.dumps(node))
    client.lpush(lists[0], _message(QUEUE, "plain"))

    def look() -> list[bytes]:
        return client.eval(_fetch_script(), 3 + len(lists), "unacked", "unacked_index",
                           queues.leases_key, *lists, "1.0", len(lists), "compass_job",
                           "compass:job:{", "}", 0)

    assert look()[2] == b"FAILURE"
    assert look()[2] == b""  # its record is gone
    assert len(look()) == 2  # not a job node
    assert client.hexists("unacked", "j1.a")  # taken into flight all the same


def test_re_placing_and_ageing_ring_the_queues_bell_dead_lettering_does_not(
        compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    client.delete(queues.staging_key("gone"), layout.bell(QUEUE), queues.dead_letter_key)
    client.lpush(queues.staging_key("gone"), "a", "b")
    assert queues.move("gone", b"a", queues.target(QUEUE, 3), _message(QUEUE))
    assert client.llen(layout.bell(QUEUE)) == 1
    assert 0 < client.pttl(layout.bell(QUEUE)) <= BELL_TTL_MS
    assert queues.dead_letter("gone", b"b", "garbage")
    assert client.llen(layout.bell(QUEUE)) == 1 and client.llen(queues.dead_letter_key) == 1
    client.delete(*layout.lists(QUEUE), layout.bell(QUEUE))
    msg = json.loads(_message(QUEUE))
    msg["headers"]["compass"] = {"priority": 0, "queued_at": time.time() - 100}
    client.lpush(layout.list_for(QUEUE, 9), json.dumps(msg))  # the lowest level's list
    assert queues.age(QUEUE, time.time(), 1.0) == 1
    assert client.llen(layout.bell(QUEUE)) == 1


def test_a_kombu_publish_onto_a_compass_queue_rings_its_bell_in_the_same_transaction(
        compass_redis_url):
    from kombu import Connection

    ring_compass_queues("compass.w.", SHARED)
    layout = RedisLayout()
    client = redis.Redis.from_url(compass_redis_url)
    client.delete(layout.bell(QUEUE), layout.bell("plain"), *layout.lists(QUEUE))
    with Connection(compass_redis_url) as conn:
        for queue in (QUEUE, "plain"):
            with conn.SimpleQueue(queue) as q:
                q.put({"n": 1}, priority=9)
    assert client.llen(layout.list_for(QUEUE, 9)) == 1 and client.llen(layout.bell(QUEUE)) == 1
    assert not client.exists(layout.bell("plain"))  # not compass's: kombu's own push


def test_the_shared_queue_gives_up_only_lapsed_leases(compass_redis_url):
    client = redis.Redis.from_url(compass_redis_url)
    queues = RedisQueues(client, RedisLayout(), "compass")
    client.lpush(SHARED, _message(SHARED, "waiting"))
    for tag in ("lapsed", "live", "unleased"):
        client.hset("unacked", tag, json.dumps([json.loads(_message(SHARED, tag)), "", SHARED]))
    now = float(client.time()[0])
    client.zadd(queues.leases_key, {"lapsed": now - 60, "live": now + 1})
    assert queues.stage([SHARED], 5.0, in_flight_only=True) == {SHARED: (1, 1)}
    assert json.loads(queues.next_staged(SHARED))[0]["headers"]["id"] == "lapsed"
    assert client.llen(SHARED) == 1  # live workers consume what waits there
    assert {t.decode() for t in client.hkeys("unacked")} == {"live", "unleased"}


def test_a_look_put_back_is_taken_next_and_rings(compass_redis_url):
    """A wait that woke on another queue's message runs the queued look too: what it took
    goes back (unfetch.lua), so the worker holds one message, as prefetch says."""
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    client.delete(*layout.lists(QUEUE), layout.bell(QUEUE))
    client.lpush(QUEUE, _message(QUEUE, "back"), _message(QUEUE, "later"))
    src, raw = _fetch(client, queues, layout.lists(QUEUE))
    args = ["unacked", "unacked_index", queues.leases_key, src, layout.bell(QUEUE),
            "back", raw, BELL_TTL_MS]
    assert client.eval(script("unfetch"), 5, *args) == 1
    assert client.hget("unacked", "back") is None
    assert client.zscore(queues.leases_key, "back") is None
    assert client.llen(layout.bell(QUEUE)) == 1
    assert json.loads(_fetch(client, queues, layout.lists(QUEUE))[1])["headers"]["id"] == "back"
    assert client.eval(script("unfetch"), 5, *args[:5], "gone", raw, BELL_TTL_MS) == 0


def test_a_publish_onto_a_compass_queue_is_one_script_that_survives_a_script_flush(
        private_redis_url):
    """push.lua (by EVALSHA) keeps kombu's push exactly: the priority list, the global key
    prefix, a queue's x-expires on each of its lists; the bell rings in the same step.
    A Redis that lost its scripts (SCRIPT FLUSH, a restart) still gets every message."""
    from kombu import Connection

    ring_compass_queues("compass.w.", SHARED)
    client = redis.Redis.from_url(private_redis_url)
    layout = RedisLayout(keyprefix="pfx:")
    queue = "compass.w.push"
    client.delete(layout.bell(queue), *layout.lists(queue))
    with Connection(private_redis_url, transport_options={"global_keyprefix": "pfx:"}) as conn, \
            conn.SimpleQueue(queue, queue_opts={"expires": 60.0}) as q:
        q.put({"n": 0}, priority=9)  # declares the queue; its script loaded
        client.delete(layout.bell(queue), *layout.lists(queue))
        client.config_resetstat()
        q.put({"n": 1}, priority=9)
        client.script_flush()
        q.put({"n": 2}, priority=0)
        stats = client.info("commandstats")
    assert client.llen(layout.list_for(queue, 9)) == 1 == client.llen(layout.list_for(queue, 0))
    assert client.llen(layout.bell(queue)) == 2
    assert 0 < client.pttl(layout.bell(queue)) <= BELL_TTL_MS
    assert 0 < client.pttl(layout.list_for(queue, 9)) <= 60_000  # kombu's x-expires
    body = json.loads(client.lindex(layout.list_for(queue, 0), 0))
    assert body["properties"]["delivery_info"]["routing_key"] == queue
    assert stats.get("cmdstat_evalsha", {}).get("calls") == 2  # the second: NOSCRIPT
    assert stats.get("cmdstat_eval", {}).get("calls") == 1  # ... so sent whole, once
    assert "cmdstat_exec" not in stats  # no MULTI/EXEC on the way
    client.delete(layout.bell(queue), *layout.lists(queue))


def test_held_pushes_go_in_one_round_trip_when_sent_and_survive_a_script_flush(
        private_redis_url):
    """Pushes held by held_pushes() reach Redis only when sent, all in one pipeline (each
    still push.lua: its list and its bell); a Redis that lost the script still gets
    every message; a push outside the block is not held."""
    from kombu import Connection

    from compass_celery.broker.fetch import held_pushes

    ring_compass_queues("compass.w.", SHARED)
    client = redis.Redis.from_url(private_redis_url)
    layout = RedisLayout()
    queues = ("compass.w.held1", "compass.w.held2")
    client.delete(*(layout.bell(q) for q in queues), *(k for q in queues
                                                       for k in layout.lists(q)))
    with Connection(private_redis_url) as conn, conn.SimpleQueue(queues[0]) as q1, \
            conn.SimpleQueue(queues[1]) as q2:
        q1.put({"n": 0}, priority=9)  # declares it, loads the script
        client.delete(layout.list_for(queues[0], 9), layout.bell(queues[0]))
        client.script_flush()
        with held_pushes() as held:
            q1.put({"n": 1}, priority=9)
            q2.put({"n": 2}, priority=0)
            assert not client.exists(layout.list_for(queues[0], 9))  # held, not sent
            assert len(held.pushes) == 2
            client.config_resetstat()
            held.send()
            stats = client.info("commandstats")
            assert not held.pushes
        q2.put({"n": 3}, priority=0)  # not held
    assert client.llen(layout.list_for(queues[0], 9)) == 1
    assert client.llen(layout.list_for(queues[1], 0)) == 2
    assert client.llen(layout.bell(queues[0])) == 1 and client.llen(layout.bell(queues[1])) == 2
    assert stats.get("cmdstat_evalsha", {}).get("calls") == 2  # both NOSCRIPT after the flush
    assert stats.get("cmdstat_eval", {}).get("calls") == 2  # ... so each sent whole
    client.delete(*(layout.bell(q) for q in queues), *(k for q in queues
                                                       for k in layout.lists(q)))


def test_a_consumer_fetches_atomically_by_evalsha_and_after_a_script_flush(
        compass_redis_url):
    """The worker's look runs fetch.lua by EVALSHA; after Redis lost its scripts the look
    that found none ran nothing, and the next one sends it whole: still atomic (each
    message in flight with a lease), nothing lost, no fallback to kombu's BRPOP."""
    from kombu import Connection

    from compass_celery.broker.fetch import install_atomic_fetch

    queue = "compass.w.sha"
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    client.delete(*layout.lists(queue), layout.bell(queue), queues.leases_key)
    ring_compass_queues("compass.w.", SHARED)
    install_atomic_fetch(queue, queues.leases_key)
    client.config_resetstat()
    with Connection(compass_redis_url) as conn, conn.SimpleQueue(queue) as q:
        execs = _calls(client, "exec")  # the queue's declaration's
        for n in range(4):
            if n == 2:
                client.script_flush()
            q.put({"n": n})
            message = q.get(timeout=5)
            assert message.payload == {"n": n}
            tag = message.delivery_tag
            assert client.hexists("unacked", tag)  # taken into flight by fetch.lua ...
            assert client.zscore(queues.leases_key, tag) is not None  # ... with a lease
            message.ack()
            assert not client.hexists("unacked", tag)
    stats = client.info("commandstats")
    assert stats.get("cmdstat_evalsha", {}).get("calls", 0) >= 4
    assert client.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0) >= 1
    assert not client.llen(queue)
    # kombu's consumer did not write the entries again (its MULTI/EXEC a delivery): the
    # only transactions are the four acks
    assert _calls(client, "exec") - execs == 4


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _fetch_held(client: redis.Redis, queues: RedisQueues, layout: RedisLayout,
                bound_ms: float, bells: tuple[str, ...] = ()) -> list[bytes] | None:
    """A look with the held slot on (as broker.fetch sends it for worker f0)."""
    from compass_celery.planner.priority import HIGHEST, PLANNED_EPS_MS
    from compass_celery.state import keys

    lists = layout.lists(QUEUE)
    levels = [HIGHEST - s for s in layout.steps]
    return client.eval(_fetch_script(), 3 + len(lists) + len(bells) + 3, "unacked",
                       "unacked_index", queues.leases_key, *lists, *bells,
                       keys.key(keys.PENDING_QUEUED, "compass"),
                       keys.key(keys.HELD_SLOT, "compass", queue=QUEUE), layout.bell(QUEUE),
                       "1.0", len(lists), "", "", "", 0,
                       len(bells), repr(bound_ms), "f0\x1f", repr(PLANNED_EPS_MS), HIGHEST,
                       *levels)


def test_a_held_slot_takes_no_lower_level_message_while_a_higher_level_is_planned(
        compass_redis_url):
    """worker.core.slot_held_until in fetch.lua: a batch (level 0) message stays in its
    list while an interactive (9) successor is planned on the worker, the bells are
    cleared (a push wakes it), an interactive message is still taken; once the planned
    count is released the batch message is taken; and with the count left set, it is
    taken once the bound has passed."""
    from compass_celery.planner.priority import PLANNED_EPS_MS
    from compass_celery.state import keys

    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    planned = keys.key(keys.PENDING_QUEUED, "compass")
    hold = keys.key(keys.HELD_SLOT, "compass", queue=QUEUE)
    bell = layout.bell(QUEUE)
    client.delete(*layout.lists(QUEUE), bell, planned, hold)
    client.lpush(layout.list_for(QUEUE, 9), _message(QUEUE, "batch"))  # broker 9: level 0
    client.hset(planned, mapping={"f0\x1f9": 560.0, "f1\x1f9": 0, "f0\x1f0": 900.0})
    shared_bell = layout.bell(SHARED)
    client.lpush(bell, "1")
    client.lpush(shared_bell, "1")
    src, left = _fetch_held(client, queues, layout, 5000.0, (bell, shared_bell))
    assert src == b"\0held" and 0 < float(left) <= 5000.0
    assert client.llen(layout.list_for(QUEUE, 9)) == 1 and not client.exists(bell)
    assert client.llen(shared_bell) == 1  # left to the shared queue's other consumers
    assert client.exists(hold)
    client.lpush(layout.list_for(QUEUE, 0), _message(QUEUE, "later"))  # level 9 arrives
    assert json.loads(_fetch_held(client, queues, layout, 5000.0)[1])["headers"]["id"] \
        == "later"
    assert not client.exists(hold)  # taking a message ends the hold
    assert _fetch_held(client, queues, layout, 5000.0)[0] == b"\0held"
    # the successor was sent elsewhere, or shed: what float sums leave counts as none
    client.hset(planned, "f0\x1f9", PLANNED_EPS_MS / 2)
    assert json.loads(_fetch_held(client, queues, layout, 5000.0)[1])["headers"]["id"] \
        == "batch"
    # the count left set (a leak): held for the bound, then taken
    client.hset(planned, "f0\x1f9", 560.0)
    client.lpush(layout.list_for(QUEUE, 9), _message(QUEUE, "batch2"))
    src, left = _fetch_held(client, queues, layout, 200.0)
    assert src == b"\0held" and float(left) <= 200.0
    time.sleep(0.25)
    assert json.loads(_fetch_held(client, queues, layout, 200.0)[1])["headers"]["id"] \
        == "batch2"
    assert _fetch_held(client, queues, layout, 200.0) is None and not client.exists(hold)


def test_a_look_acks_the_tags_it_carries_before_it_takes_the_next_message(
        compass_redis_url):
    """fetch.lua's acks: each tag's unacked entry, index score and lease are gone, as
    kombu's ack (and the lease's drop) would leave them, in the same step as the look;
    a tag no longer in flight is a no-op; a look that finds nothing still acks."""
    client = redis.Redis.from_url(compass_redis_url)
    queues, layout = RedisQueues(client, RedisLayout(), "compass"), RedisLayout()
    client.delete(*layout.lists(QUEUE), "unacked", "unacked_index", queues.leases_key)
    for tid in ("one", "two", "three"):
        client.lpush(layout.list_for(QUEUE, 0), _message(QUEUE, tid))
    assert json.loads(_fetch(client, queues, layout.lists(QUEUE))[1])["headers"]["id"] \
        == "one"
    assert client.hexists("unacked", "one")
    src, raw = _fetch(client, queues, layout.lists(QUEUE), acks=("one", "gone"))
    assert json.loads(raw)["headers"]["id"] == "two"
    assert not client.hexists("unacked", "one")
    assert client.zscore("unacked_index", "one") is None
    assert client.zscore(queues.leases_key, "one") is None
    assert client.hexists("unacked", "two")  # the one taken stays in flight
    _fetch(client, queues, layout.lists(QUEUE), acks=("two",))
    assert _fetch(client, queues, layout.lists(QUEUE), acks=("three",)) is None
    assert not client.hlen("unacked") and not client.zcard("unacked_index")
    assert not client.zcard(queues.leases_key)


def _declare(client: redis.Redis, queue: str, leases_key: str) -> RedisLayout:
    from compass_celery.broker.fetch import install_atomic_fetch

    layout = RedisLayout()
    client.delete(*layout.lists(queue), layout.bell(queue), leases_key, "unacked",
                  "unacked_index")
    ring_compass_queues("compass.w.", SHARED)
    install_atomic_fetch(queue, leases_key)
    return layout


def _looped_queue(url: str, queue: str):
    """A declared compass queue with the atomic fetch, and an event loop for its consumer:
    (client, queues, hub, the delivery tags seen)."""
    from kombu.asynchronous import Hub

    client = redis.Redis.from_url(url)
    queues = RedisQueues(client, RedisLayout(), "compass")
    _declare(client, queue, queues.leases_key)
    return client, queues, Hub(), []


def test_an_ack_on_the_event_loop_rides_the_next_look_and_no_transaction_of_its_own(
        compass_redis_url):
    """Celery's worker on kombu's event loop: each delivery's ack runs on the loop's next
    turn (as Celery's acks do: hub.call_soon), then the loop sends the next look. The
    ack sends no MULTI/EXEC: that look acks it (one round trip for both), the last one
    included (the look that finds nothing). Nothing is left in flight or leased."""
    from kombu import Connection, Consumer, Queue

    queue = "compass.w.ack"
    client, queues, hub, seen = _looped_queue(compass_redis_url, queue)

    def on_message(body: dict, message) -> None:
        seen.append(message.delivery_tag)
        hub.call_soon(message.ack)

    with Connection(compass_redis_url) as conn:
        with conn.SimpleQueue(queue) as q:
            for n in range(3):
                q.put({"n": n})
        conn.register_with_event_loop(hub)
        with Consumer(conn.default_channel, [Queue(queue)], callbacks=[on_message],
                      prefetch_count=1):
            client.config_resetstat()  # after the queue's declaration (a transaction)
            loop, until = hub.create_loop(), time.monotonic() + 10
            while (len(seen) < 3 or client.hlen("unacked")) and time.monotonic() < until:
                next(loop)
        hub.close()
    assert len(seen) == 3
    assert not client.hlen("unacked") and not client.zcard("unacked_index")
    assert not client.zcard(queues.leases_key)
    assert _calls(client, "exec") == 0 and _calls(client, "multi") == 0
    assert _calls(client, "evalsha") + _calls(client, "eval") >= 4  # three takes, a look


def test_an_ack_no_look_carried_is_sent_when_the_channel_closes(compass_redis_url):
    """A worker stopping after a task: the ack waiting for the next look is sent when the
    channel closes (its message is not left in flight for recovery to run again); an
    ack made without an event loop (kombu's own consumers) is kombu's, at once."""
    from kombu import Connection, Consumer, Queue

    queue = "compass.w.close"
    client, queues, hub, seen = _looped_queue(compass_redis_url, queue)

    def on_message(body: dict, message) -> None:
        seen.append(message.delivery_tag)
        message.ack()  # inside the delivery: before the next look
        assert client.hexists("unacked", message.delivery_tag)

    with Connection(compass_redis_url) as conn:
        with conn.SimpleQueue(queue) as q:
            q.put({"n": 0})
        conn.register_with_event_loop(hub)
        channel = conn.channel()
        with Consumer(channel, [Queue(queue)], callbacks=[on_message], prefetch_count=1):
            loop, until = hub.create_loop(), time.monotonic() + 10
            while not seen and time.monotonic() < until:
                next(loop)
            assert client.hexists("unacked", seen[0])  # no look since
            channel.close()
        hub.close()
        assert not client.hexists("unacked", seen[0])  # sent on close
        assert not client.zcard("unacked_index")
    with Connection(compass_redis_url) as conn, conn.SimpleQueue(queue) as q:
        q.put({"n": 1})
        message = q.get(timeout=5)
        message.ack()
        assert not client.hexists("unacked", message.delivery_tag)
    assert not client.llen(queue)


def test_an_ack_after_the_channel_stopped_consuming_its_queue_is_sent_at_once(
        compass_redis_url):
    """A consumer cancelled before its task's ack (Celery's cancel_consumer) sends no more
    looks: the ack is kombu's own, at once, not left waiting for a look."""
    from kombu import Connection, Consumer, Queue
    from kombu.asynchronous import Hub

    queue = "compass.w.cancel"
    client = redis.Redis.from_url(compass_redis_url)
    queues = RedisQueues(client, RedisLayout(), "compass")
    _declare(client, queue, queues.leases_key)
    hub, seen = Hub(), []
    with Connection(compass_redis_url) as conn:
        with conn.SimpleQueue(queue) as q:
            q.put({"n": 0})
        conn.register_with_event_loop(hub)
        consumer = Consumer(conn.default_channel, [Queue(queue)], prefetch_count=1)

        def on_message(body: dict, message) -> None:
            consumer.cancel()
            message.ack()
            seen.append(message.delivery_tag)

        consumer.register_callback(on_message)
        consumer.consume()
        loop, until = hub.create_loop(), time.monotonic() + 10
        while not seen and time.monotonic() < until:
            next(loop)
        assert seen and not client.hexists("unacked", seen[0])
        hub.close()
