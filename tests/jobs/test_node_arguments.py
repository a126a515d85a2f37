"""A node's bad arguments are refused when the Dag is built or sent, by an error that
names the Dag and the node: arguments JSON cannot carry, and a batched task given other
than one input. Eager mode, no Redis: these are the caller's checks."""

from __future__ import annotations

import datetime

import pytest
from celery import Celery

from compass_celery import Compass, Dag
from compass_celery.dag_validation import DagValidationError


@pytest.fixture
def app() -> Celery:
    app = Celery("node-args", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, compass_models={"m": 10.0})
    Compass(app)

    @app.task(name="n.one", compass_model="m", compass_exec_ms=5, shared=False)
    def one(*xs: object, **kw: object) -> int:
        return 1

    @app.task(name="n.embed", compass_model="m", compass_exec_ms=5, shared=False,
              compass_batch={"max_size": 8, "max_wait_ms": 0})
    def embed(xs: list[object]) -> list[object]:
        return xs

    return app


def test_an_argument_json_cannot_carry_names_its_node_when_added(app: Celery) -> None:
    dag = Dag(app, "search")
    dag.node("ok", app.tasks["n.one"].s(1))
    with pytest.raises(DagValidationError,
                       match=r"DAG 'search': node 'when' \(n.one\).*not JSON.*datetime"):
        dag.node("when", app.tasks["n.one"].s(datetime.datetime(2026, 1, 1)))
    with pytest.raises(DagValidationError, match=r"node 'kw' \(n.one\).*not JSON"):
        dag.node("kw", app.tasks["n.one"].s(x={1, 2}))


def test_an_argument_changed_after_it_was_added_is_named_at_send(app: Celery) -> None:
    dag = Dag(app, "later")
    sig = app.tasks["n.one"].s(1)
    dag.node("a", sig)
    sig.args = (object(),)
    with pytest.raises(DagValidationError, match=r"DAG 'later': node 'a' \(n.one\).*not JSON"):
        dag.apply_async()


def test_a_batched_node_given_other_than_one_input_is_refused_at_send(app: Celery) -> None:
    """A batched task takes one input: a source's own argument, or a later node's
    predecessors' result (then no argument of its own). Caught when the Dag is sent,
    naming the node, not when the node runs."""
    embed, one = app.tasks["n.embed"], app.tasks["n.one"]
    two = Dag(app, "two")
    two.node("e", embed.s("a", "b"))
    with pytest.raises(DagValidationError, match=r"DAG 'two': node 'e'.*batched.*one input"):
        two.apply_async()
    extra = Dag(app, "extra")
    a = extra.node("a", one.s(1))
    extra.node("e", embed.s("own"), after=[a])  # its input is a's result already
    with pytest.raises(DagValidationError, match=r"DAG 'extra': node 'e'.*batched"):
        extra.apply_async()
    none = Dag(app, "none")
    none.node("e", embed.s())
    with pytest.raises(DagValidationError, match=r"DAG 'none': node 'e'.*batched"):
        none.apply_async()
    good = Dag(app, "good")
    a = good.node("a", one.s(1))
    good.node("e", embed.s(), after=[a])
    good.node("f", embed.s("x"))
    assert good.apply_async().get() == {"e": 1, "f": "x"}
