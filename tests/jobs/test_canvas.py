"""Dag.from_canvas in eager mode: every supported canvas gives what Celery gives for it,
and every refused one says where and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.canvas import Signature, _chain

from compass_celery import Compass
from compass_celery.dag_validation import DagValidationError
from compass_celery.jobs.dag import CanvasDag, Dag
from compass_celery.testing import add_worker


@pytest.fixture
def app() -> Celery:
    app = Celery("canvas", set_as_current=False)
    app.conf.update(task_always_eager=True, task_eager_propagates=True, compass_validate=True,
                    compass_models={"small": 50, "big": 3000})
    Compass(app)

    @app.task(name="cv.src", shared=False, compass_model="small", compass_exec_ms=5)
    def src(x: Any) -> Any:
        return x

    @app.task(name="cv.add", shared=False, compass_model="small", compass_exec_ms=5)
    def add(inp: int, k: int) -> int:
        return inp + k

    @app.task(name="cv.total", shared=False, compass_model="big", compass_exec_ms=5)
    def total(inputs: list[int]) -> int:
        return sum(inputs)

    @app.task(name="cv.pair", shared=False, compass_model="small", compass_exec_ms=5)
    def pair(inp: Any, label: str) -> list[Any]:
        return [label, inp]

    add_worker(app, "g0", gpu_mb=4000, resident=["small", "big"])
    add_worker(app, "g1", gpu_mb=4000, resident=["small"])
    return app


def tasks(app: Celery) -> tuple[Any, Any, Any, Any]:
    t = app.tasks
    return t["cv.src"], t["cv.add"], t["cv.total"], t["cv.pair"]


Canvas = Callable[[Any, Any, Any, Any], Signature]

# Each factory builds a fresh canvas, so neither run can see the other's mutations.
SUPPORTED: dict[str, Canvas] = {
    "single task": lambda s, a, t, p: s.s(1),
    "chain": lambda s, a, t, p: s.s(1) | a.s(2) | a.s(3),
    "chain with kwargs": lambda s, a, t, p: chain(s.s(1), a.s(k=4), p.s(label="x")),
    "chain of chains": lambda s, a, t, p: chain(s.s(1) | a.s(1), a.s(2) | a.s(3)),
    "group": lambda s, a, t, p: group(s.s(1), a.s(2, 3), s.s(4)),
    "one-member group": lambda s, a, t, p: group([s.s(1)]),
    "chord": lambda s, a, t, p: chord([s.s(1), s.s(2), a.s(1, 2)], t.s()),
    "chord with body args": lambda s, a, t, p: chord([s.s(1), s.s(2)], p.s("sum")),
    "group | task (a chord)": lambda s, a, t, p: group(s.s(1), s.s(2)) | t.s(),
    "chain led by a group (a chord)": lambda s, a, t, p: chain(group(s.s(1), s.s(2)), t.s()),
    "group in a chain feeding a task": lambda s, a, t, p: (
        s.s(1) | group(a.s(1), a.s(2)) | t.s() | a.s(10)),
    "chain ending in a group": lambda s, a, t, p: s.s(1) | group(a.s(1), a.s(2), p.s("c")),
    "chain ending in a group, then a task": lambda s, a, t, p: (
        (s.s(1) | group(a.s(1), a.s(2))) | t.s()),
    "group then group in a chain": lambda s, a, t, p: chain(
        s.s(1), group(a.s(1), a.s(2)), group(p.s("x"), t.s()), p.s("end")),
    "chain ending in group then group": lambda s, a, t, p: chain(
        s.s(1), group(a.s(1), a.s(2)), group(p.s("x"), t.s())),
    "group of chains": lambda s, a, t, p: group(s.s(1) | a.s(1), s.s(5) | a.s(2) | a.s(3)),
    "chain of a chord (nested)": lambda s, a, t, p: chain(
        s.s(1), chord([a.s(1), a.s(2)], t.s()), a.s(100)),
    "chord with a chain body": lambda s, a, t, p: chord([s.s(1), s.s(2)], t.s() | a.s(1)),
    "chord with a group body": lambda s, a, t, p: chord(
        [s.s(1), s.s(2)], group(t.s(), p.s("all"))),
    "chord of chains and a chord": lambda s, a, t, p: chord(
        [s.s(1) | a.s(1), chord([s.s(2), s.s(3)], t.s())], p.s("x")),
    "chord of chords in a chain": lambda s, a, t, p: chain(
        s.s(2), chord([chord([a.s(1), a.s(2)], t.s()), a.s(3)], t.s()), p.s("end")),
    "group inside a group (flattened)": lambda s, a, t, p: group(
        group(s.s(1), s.s(2)), s.s(3)),
    "group member ending in a group (nested list)": lambda s, a, t, p: group(
        s.s(1) | group(a.s(1), a.s(2)), s.s(3)),
    "group of chords": lambda s, a, t, p: group(chord([s.s(1), s.s(2)], t.s()), s.s(9)),
    "immutable sources": lambda s, a, t, p: chain(
        chord([s.si(1), s.si(2)], t.s()), a.s(1)),
    "immutable chain head": lambda s, a, t, p: chain(s.si(7), a.s(1)),
}


@pytest.mark.parametrize("build", SUPPORTED.values(), ids=SUPPORTED.keys())
def test_same_result_as_celery(app: Celery, build: Canvas) -> None:
    celery_apply = build(*tasks(app)).apply().get()
    celery_async = build(*tasks(app)).apply_async().get()
    assert celery_apply == celery_async  # the baseline itself is consistent
    dag = Dag.from_canvas(build(*tasks(app)), "migrated")
    assert isinstance(dag, CanvasDag)
    job = dag.apply_async()
    assert dag.canvas_result(job) == celery_async
    assert set(job.placement()) == set(dag.nodes)  # planned whole: every node has a place


def test_the_canvas_is_left_as_it_was(app: Celery) -> None:
    s, a, t, p = tasks(app)
    canvas = chain(s.s(1), chord([a.s(1), a.s(2)], t.s()), a.s(100))
    before = repr(canvas), dict(canvas)
    dag = Dag.from_canvas(canvas)
    assert (repr(canvas), dict(canvas)) == before
    assert dag.canvas_result(dag.apply_async()) == canvas.apply_async().get() == 105


def test_node_names_follow_task_names_and_edges_follow_the_canvas(app: Celery) -> None:
    s, a, t, p = tasks(app)
    dag = Dag.from_canvas(chain(s.s(1), group(a.s(1), a.s(2)), t.s(), a.s(3)), "named", app=app)
    assert list(dag.nodes) == ["src", "add", "add-2", "total", "add-3"]
    assert {n: v.preds for n, v in dag.nodes.items()} == {
        "src": [], "add": ["src"], "add-2": ["src"], "total": ["add", "add-2"],
        "add-3": ["total"]}
    # the chain's own partial args stay, after the predecessor's result
    assert dag.nodes["add-3"].signature.args == (3,)
    # models and estimates come from the task declarations, as for any Dag node
    assert dag.nodes["total"].model == "big"


def test_results_can_be_mapped_again_from_a_rebuilt_dag(app: Celery) -> None:
    s, a, t, p = tasks(app)
    first = Dag.from_canvas(group(s.s(1) | a.s(1), chord([s.s(2), s.s(3)], t.s())))
    sinks = first.apply_async().get()
    again = Dag.from_canvas(group(s.s(1) | a.s(1), chord([s.s(2), s.s(3)], t.s())))
    assert again.result_of(sinks) == [2, 5]
    assert list(again.nodes) == list(first.nodes)


def test_app_comes_from_the_canvas_or_is_asked_for(app: Celery) -> None:
    assert Dag.from_canvas(app.signature("cv.src", (1,))).app is app
    with pytest.raises(DagValidationError, match="no task bound to an app; pass app="):
        Dag.from_canvas(Signature("cv.src", (1,)))
    assert Dag.from_canvas(Signature("cv.src", (1,)), app=app).app is app


REFUSED: dict[str, tuple[Canvas, str]] = {
    "immutable after a step": (
        lambda s, a, t, p: chain(s.s(1), s.si(2)),
        r"chain step 1: immutable signature task 'cv.src' \(.si\(\)\) after another step: "
        r"a Dag node always receives its predecessors' results"),
    "immutable chord body": (
        lambda s, a, t, p: chord([s.s(1), s.s(2)], t.si([0])),
        r"chord body: immutable signature task 'cv.total'"),
    "link": (
        lambda s, a, t, p: chain(s.s(1).set(link=a.s(1)), a.s(2)),
        r"chain step 0: 'link' on task 'cv.src': link callbacks are not part of the planned "
        r"job"),
    "link_error": (
        lambda s, a, t, p: s.s(1).set(link_error=[p.s("err")]),
        r"'link_error' on task 'cv.src': link_error callbacks are not run"),
    "countdown": (
        lambda s, a, t, p: group(s.s(1), s.s(2).set(countdown=3)),
        r"group member 1: 'countdown' on task 'cv.src'"),
    "chunks": (
        lambda s, a, t, p: a.chunks([(1, 2), (3, 4)], 1),
        r"chunks \(task.chunks\) runs every call of 'cv.add' in a loop inside one built-in "
        r"Celery task"),
    "xmap": (
        lambda s, a, t, p: s.map([1, 2]),
        r"xmap \(task.map\) runs every call of 'cv.src'"),
    "xstarmap": (
        lambda s, a, t, p: chain(s.s(1), a.starmap([(1, 2)])),
        r"chain step 1: xstarmap \(task.starmap\)"),
    "empty group": (
        lambda s, a, t, p: group([]),
        r"canvas: empty group: there is nothing to run"),
    "empty group inside a group": (
        lambda s, a, t, p: group(group([]), s.s(1)),
        r"group member 0: empty group"),
    "empty chord header": (
        lambda s, a, t, p: chord([], t.s()),
        r"chord header: empty group"),
    "empty chain": (
        lambda s, a, t, p: _chain(),
        r"empty chain: there is nothing to run"),
    "chord without a body": (
        lambda s, a, t, p: chord([s.s(1), s.s(2)]),
        r"chord without a body"),
    "one-task chord header": (
        lambda s, a, t, p: chord([s.s(1)], t.s()),
        r"chord body: a chord header of a single task: Celery hands the body a one-element "
        r"list"),
    "flattened group feeding a step": (
        lambda s, a, t, p: chord([group(s.s(1), s.s(2)), s.s(3)], t.s()),
        r"chord body: a group written directly inside a group feeds this step"),
    "nested list feeding a step": (
        lambda s, a, t, p: chain(group(s.s(1) | group(a.s(1), a.s(2)), s.s(3)), t.s()),
        r"a group member that itself ends in a group feeds this step"),
    "unknown task": (
        lambda s, a, t, p: chain(s.s(1), s.app.signature("no.such")),
        r"chain step 1: DAG 'old': node 'such' names unknown task 'no.such'"),
}


@pytest.mark.parametrize("build, message", REFUSED.values(), ids=REFUSED.keys())
def test_refused_shapes_are_named(app: Celery, build: Canvas, message: str) -> None:
    with pytest.raises(DagValidationError, match=message) as err:
        Dag.from_canvas(build(*tasks(app)), "old", app=app)
    assert str(err.value).startswith("canvas 'old': ")


def test_not_a_signature_is_named(app: Celery) -> None:
    with pytest.raises(DagValidationError, match="expected a Celery signature, got int"):
        Dag.from_canvas(3, "x", app=app)  # type: ignore[arg-type]
