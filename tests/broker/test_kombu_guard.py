"""Why compass patches ``kombu.transport.redis.loads`` for the whole worker process, and
what the patch keeps.

kombu decodes a queue entry right after BRPOP took it off the list. A decode error
escapes its consumer loop (the worker dies and the entry is gone), and a JSON object
that is not a kombu message fails later as if the connection had dropped. kombu has
no hook for this, so the worker step wraps the one function, once per process.
"""

from __future__ import annotations

import json

import kombu.transport.redis as kredis
import pytest

from compass_celery.broker.kombu_redis import guard_undecodable

MESSAGE = json.dumps({"body": "e30=", "headers": {"task": "t"}, "content-type":
                      "application/json", "properties": {"delivery_tag": "tag-1"}})


@pytest.fixture
def restored(monkeypatch):
    """The patch is process-wide: put kombu's own function back after each test."""
    monkeypatch.setattr(kredis, "loads", kredis.loads)
    return kredis.loads


def test_without_the_guard_kombu_raises_on_garbage(restored) -> None:
    with pytest.raises(ValueError):
        kredis.loads(b"\xff not json")


def test_the_guard_keeps_what_kombu_would_lose_and_passes_the_rest(restored) -> None:
    seen: list[tuple[str, str]] = []
    guard_undecodable(lambda raw, why: seen.append((raw, why)))
    assert kredis.loads(MESSAGE) == restored(MESSAGE)  # a message passes unchanged
    assert kredis.loads('["unacked", 1]') == ["unacked", 1]  # kombu's unacked entries too
    assert not seen
    with pytest.raises(kredis.Empty):  # the read counts as empty: the consumer goes on
        kredis.loads("{not json")
    with pytest.raises(kredis.Empty):
        kredis.loads('{"neither": "celery"}')
    assert [why.split(" ")[0] for _, why in seen] == ["not", "not"]
    assert seen[0][0] == "{not json" and "JSON" in seen[0][1]
    assert seen[1][0] == '{"neither": "celery"}' and "delivery_tag" in seen[1][1]


def test_the_guard_is_installed_once_per_process(restored) -> None:
    first: list[str] = []
    guard_undecodable(lambda raw, why: first.append(raw))
    wrapped = kredis.loads
    guard_undecodable(lambda raw, why: None)  # a second worker step in the same process
    assert kredis.loads is wrapped  # not wrapped twice
    with pytest.raises(kredis.Empty):
        kredis.loads("{x")
    assert first == ["{x"]
