"""Plain (non-Dag) tasks behave as Dags do: the same call keywords, the same limits, the
same errors; and a send that fails is told apart by the exception's type."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from compass_celery import Compass, SendFailed


def _app(name: str, **conf: object) -> Celery:
    app = Celery(name, broker="memory://", backend="redis://127.0.0.1:1/0",
                 set_as_current=False)
    app.conf.update(compass_models={"m": 10.0}, **conf)
    Compass(app)
    return app


def _task(app: Celery, name: str = "p.t") -> object:
    @app.task(name=name, compass_model="m", compass_exec_ms=5, shared=False)
    def t(x: int = 0) -> int:
        return x

    return t


def test_send_failed_is_chosen_by_the_errors_type_not_its_text(monkeypatch) -> None:
    """The result store giving up on reconnecting (a RuntimeError raised from a connection
    error, whatever its words) is a SendFailed; a RuntimeError that merely mentions the
    result store, with no connection error behind it, is left as it is."""
    app = _app("sf")
    t = _task(app)

    def gave_up(*args: object, **kwargs: object) -> None:
        try:
            raise redis.ConnectionError("Connection refused")
        except redis.ConnectionError as exc:
            raise RuntimeError("reconnecting gave up; restart the app") from exc

    monkeypatch.setattr(app.backend, "on_task_call", gave_up)
    with pytest.raises(SendFailed, match="'p.t' was not sent.*Connection refused"):
        t.delay(1)

    def own_bug(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the result store hook has a bug")

    monkeypatch.setattr(app.backend, "on_task_call", own_bug)
    with pytest.raises(RuntimeError, match="hook has a bug") as err:
        t.delay(1)
    assert not isinstance(err.value, SendFailed)
