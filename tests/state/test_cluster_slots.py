"""Every script compass runs on its state Redis, and every transaction, touches one Redis
Cluster hash slot: the keys of each call are recorded and hashed with redis-py's
``key_slot`` (no Redis needed). Also the ``redis+cluster://`` URL parsing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster, key_slot

from compass_celery.jobs.keys import JobKeys, deadlines_key, once_keys
from compass_celery.local import free_port
from compass_celery.planner.types import WorkerView
from compass_celery.state import keys
from compass_celery.state.cluster import is_cluster_url
from compass_celery.state.connection import StateUnavailable, connect
from compass_celery.state.scripts import HOMES, script
from compass_celery.state.store import RedisStateStore

PACKAGE = Path(__file__).resolve().parents[2] / "compass_celery"
#: Scripts that run on the broker's Redis (kombu's keys), never on a cluster.
BROKER_SCRIPTS = {"stage", "move", "lease", "promote", "claim", "fetch", "inflight",
                  "unfetch", "push"}
PREFIXES = ["compass", "app:two", "a{b}c", "x}y"]


def slots(names: list[str]) -> set[int]:
    return {key_slot(k.encode()) for k in names}


class Recorder:
    """A stand-in Redis client: records the KEYS of every script call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def register_script(self, source: str) -> Any:
        name = next((n for n in HOMES if n != "changelog" and script(n) in source), "?")

        def call(keys: Any = None, args: Any = None, client: Any = None) -> Any:
            self.calls.append((name, list(keys or [])))
            if name == "snapshot":
                return [b"e", 0, "1.0", "full", 0, [], ["0", []], [[]] * 8, []]
            if name == "learn":
                return [1]
            return b"0"
        return call

    def pipeline(self, transaction: bool = True) -> Any:
        return self

    def execute(self) -> list[Any]:
        return []


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_state_script_call_is_single_slot(prefix):
    client = Recorder()
    store = RedisStateStore("redis://unused", prefix, client_factory=lambda url: client)
    view = WorkerView(name="w{1}", queue=f"{prefix}.w.w{{1}}", gpu_total_mb=10.0,
                      gpu_free_mb=10.0, resident=frozenset(), speed=1.0, heartbeat=time.time(),
                      load_mb_per_s=1.0, host_load_mb_per_s=1.0, net_mb_per_s=1.0)
    store.publish(view)
    store.remove("w{1}")
    store.charge("w{1}", 5.0)
    store.set_backlog("w{1}", 5.0)
    store.charge(keys.queued_member("w{1}", 2), 5.0, table="queued")
    store.set_backlog(keys.forming_member("w{1}", "t|m"), 1, table="forming")
    store.add_pending("w{1}", 5.0)
    store.record_run("task|model", 5.0, 0.3)
    store.record_plan_error("interactive", 5.0, 0.9, 10.0)
    store.snapshot(time.time(), 30.0)
    assert {name for name, _ in client.calls} == {"publish", "remove", "counters", "learn",
                                                  "snapshot"}
    state_slot = slots([keys.key(keys.WORKERS, prefix)])
    for name, used in client.calls:
        assert slots(used) == state_slot, (name, used)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("job_id", ["0123abcd" * 4, "job{x}", "j"])
def test_job_scripts_and_transactions_are_single_slot(prefix, job_id):
    jk = JobKeys.of(prefix, job_id)
    assert len(slots(jk.all())) == 1  # complete.lua, and submission's record transaction
    assert len(slots([jk.job, jk.done])) == 1  # fail.lua
    assert len(slots([jk.tasks])) == 1  # submission's confirmation
    state = slots([keys.key(keys.WORKERS, prefix)])
    # once.lua, alone or with the deadline in one transaction
    assert slots([*once_keys(prefix, f"{job_id}:plan"), deadlines_key(prefix)]) == state


def test_job_keys_carry_the_job_id_as_their_tag():
    jk = JobKeys.of("compass", "abc")
    assert jk.all() == ["compass:job:{abc}", "compass:job:{abc}:out", "compass:job:{abc}:left",
                        "compass:job:{abc}:done", "compass:job:{abc}:info",
                        "compass:job:{abc}:tasks"]
    assert keys.key(keys.WORKERS, "compass") == "{compass}:workers"
    assert deadlines_key("compass") == "{compass}:jobs:deadlines"


def test_every_script_is_checked_or_runs_on_the_broker():
    checked = {"changelog", "publish", "remove", "counters", "learn", "snapshot", "complete",
               "fail", "once"}
    shipped = {p.stem for p in PACKAGE.glob("*/lua/*.lua")}
    assert shipped == set(HOMES), "every script file is named in scripts.HOMES, and only those"
    assert shipped <= checked | BROKER_SCRIPTS, \
        "a new script: check its KEYS share one slot here"
    assert {n for n in BROKER_SCRIPTS if HOMES[n] != "broker"} == set()


def test_cluster_urls(monkeypatch):
    assert is_cluster_url("redis+cluster://h:1") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:1") and not is_cluster_url(None)
    seen: dict[str, Any] = {}

    def from_url(url: str, **kwargs: Any) -> str:
        seen.update(url=url, **kwargs)
        return "a cluster client"

    monkeypatch.setattr(RedisCluster, "from_url", from_url)
    assert connect("rediss+cluster://user:pw@10.0.0.1:7000,10.0.0.2:7001?ssl_cert_reqs=none") \
        == "a cluster client"
    assert seen["url"] == "rediss://user:pw@10.0.0.1:7000?ssl_cert_reqs=none"
    assert [(n.host, n.port) for n in seen["startup_nodes"]] == [("10.0.0.2", 7001)]
    assert seen["socket_timeout"] == 2.0  # the same short timeouts as a single Redis
    with pytest.raises(ValueError, match="host:port"):
        connect("redis+cluster://nohost")


def test_an_unreachable_cluster_is_state_unavailable():
    store = RedisStateStore(f"redis+cluster://127.0.0.1:{free_port()}")
    with pytest.raises(StateUnavailable, match="unavailable"):
        store.snapshot(time.time(), 30.0)
