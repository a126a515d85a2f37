"""A task charged less than a snapshot's TTL starts quietly (real Redis, in process).

Its start would cost a round trip (its level's queued work released) and a record
publish (its running span) before its body runs; a plan would mostly read either after
the task's end. So its end releases the queued work with the total, in the end's own
round trip, and the publisher is not woken for its span. A longer task says both at
its start, as before. docs/results/dagvar/ab.txt has what the no-op job paid."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

from compass_celery import Compass, ledger
from compass_celery.placement import Decision
from compass_celery.state import keys
from compass_celery.worker.hop import DispatchHop
from compass_celery.worker.overhead import HandlerCpu
from compass_celery.worker.task_path import TaskPath

pytestmark = pytest.mark.redis
NAME = "quiet@one"
LEVEL = 3


class _Leases:
    def hold(self, task_id: str, tag: str) -> None:
        pass

    def release(self, task_id: str) -> None:
        pass


class _Served:
    def serving(self) -> None:
        pass

    def ran(self, *args: object, **kwargs: object) -> None:
        pass


@pytest.fixture
def path(compass_redis_url):
    app = Celery("quiet", broker="memory://", set_as_current=False)
    app.conf.update(compass_redis_url=compass_redis_url, compass_key_prefix="quiet",
                    compass_models={"m": 10.0}, compass_snapshot_ttl_s=0.05)
    Compass(app)
    c = app.compass
    tp = TaskPath(c, NAME, c.settings, cache=None, served=_Served(), jobs=None,
                  leases=_Leases(), queued=lambda n: [], wake=threading.Event(),
                  stopping=threading.Event(), hop=DispatchHop(0.2), cpu=HandlerCpu())
    yield tp, redis.Redis.from_url(compass_redis_url)
    c.close()


def _sent(tp: TaskPath, task_id: str, charge_ms: float):
    """A task charged to this worker at LEVEL as a send charges it, as the worker sees it."""
    decision = Decision(task="t", model=None, worker=NAME, queue="q", policy="compass",
                        charge_ms=charge_ms, priority=LEVEL)
    ledger.charge(tp.compass, decision)
    request = SimpleNamespace(id=task_id, compass=decision.as_header(), task="t")
    return SimpleNamespace(name="t", request=request), request, decision


def _counts(client) -> tuple[float, float]:
    """(the worker's backlog, its queued work at LEVEL) in Redis."""
    backlog = client.hget(keys.key(keys.BACKLOG, "quiet"), NAME)
    queued = client.hget(keys.key(keys.QUEUED, "quiet"), keys.queued_member(NAME, LEVEL))
    return float(backlog or 0), float(queued or 0)


def test_a_short_task_starts_quietly_and_its_end_releases_it_all(path):
    tp, client = path
    task, request, decision = _sent(tp, "short", 2.0)
    tp.moving(request.id)  # received
    tp.task_started(task, request)
    assert _counts(client) == (2.0, 2.0)  # no round trip before its body
    assert not tp._wake.is_set()  # no record publish asked for its span
    assert tp.spans()  # its span is there for the next periodic publish
    assert tp.ledger_epoch() is None  # its charges are still changing: no reconcile
    tp.task_finished(task, request, decision, "SUCCESS")
    assert _counts(client) == (0.0, 0.0)
    assert tp.ledger_epoch() is not None


def test_a_task_longer_than_the_ttl_says_so_at_its_start(path):
    tp, client = path
    task, request, decision = _sent(tp, "long", 80.0)
    tp.moving(request.id)
    tp.task_started(task, request)
    assert _counts(client) == (80.0, 0.0)  # it waits no longer
    assert tp._wake.is_set()
    assert tp.ledger_epoch() is not None
    tp.task_finished(task, request, decision, "SUCCESS")
    assert _counts(client) == (0.0, 0.0)


def test_a_short_task_revoked_while_it_runs_still_releases_its_queued_work(path):
    tp, client = path
    task, request, decision = _sent(tp, "revoked", 2.0)
    tp.task_started(task, request)
    tp.task_revoked(request)
    assert _counts(client) == (0.0, 0.0)
