"""DAG validation: every error names its node, edge or field; fuzzing never escapes."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass_celery.dag_validation import DagValidationError, dag_from_dict, validate_dag
from compass_celery.planner.types import DagSpec, TaskSpec

MODELS = {"det": 250.0, "cap": 950.0}


def spec(edges=(), **nodes) -> DagSpec:
    tasks = {n: TaskSpec(n, model=m, exec_ms=10.0) for n, m in nodes.items()}
    return DagSpec(nodes=tasks, edges=tuple(edges), name="t")


def test_valid_dag_is_returned_unchanged():
    s = spec([("a", "b")], a="det", b="cap")
    assert validate_dag(s, known_models=MODELS, max_gpu_mb=1000) is s


@pytest.mark.parametrize(
    ("dag", "kwargs", "needles"),
    [
        (DagSpec(nodes={}, name="t"), {}, ["no nodes"]),
        (spec(a="det", b="det", c="det"), {"max_nodes": 2}, ["3 nodes", "2"]),
        (spec([("a", "zz")], a="det"), {}, ["'a' -> 'zz'", "missing node 'zz'"]),
        (spec([("a", "a")], a="det"), {}, ["self-loop", "'a'"]),
        (spec([("a", "b"), ("b", "c"), ("c", "a")], a="det", b="det", c="det"), {},
         ["cycle", "a -> b -> c -> a"]),
        (spec(a="nope"), {"known_models": MODELS}, ["'a'", "unknown model 'nope'"]),
        (spec(a="cap"), {"known_models": MODELS, "max_gpu_mb": 800},
         ["'a'", "'cap'", "950", "800"]),
        (spec([("a", "b"), ("a", "b")], a="det", b="det"), {}, ["duplicate edge"]),
        (DagSpec(nodes={"": TaskSpec("")}, name="t"), {}, ["non-empty"]),
        (DagSpec(nodes={"a": TaskSpec("b")}, name="t"), {}, ["'a'", "'b'"]),
    ],
)
def test_errors_name_the_culprit(dag, kwargs, needles):
    with pytest.raises(DagValidationError) as info:
        validate_dag(dag, **kwargs)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize("field", ["exec_ms", "output_kb"])
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True])
def test_bad_numbers_name_node_and_field(field, bad):
    task = TaskSpec("a", model="det", **{field: bad})
    with pytest.raises(DagValidationError, match=f"'a'.*{field}"):
        validate_dag(DagSpec(nodes={"a": task}, name="t"))


def template(**over):
    base = {
        "nodes": {"ocr": {"model": "det", "exec_ms": 90, "output_kb": 8},
                  "cls": {"model": "cap", "exec_ms": 15}},
        "edges": [["ocr", "cls"]],
    }
    base.update(over)
    return base


def test_dag_from_dict_parses_template():
    d = dag_from_dict("document", template(), MODELS)
    assert d.name == "document" and d.edges == (("ocr", "cls"),)
    assert d.nodes["ocr"] == TaskSpec("ocr", "det", 90.0, 8.0)
    assert d.nodes["cls"].output_kb == 0.0


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (template(nodes={"ocr": {"model": "det", "exec_ms": "fast"}}),
         "dags.document.nodes.ocr.exec_ms: expected a number, got 'fast'"),
        (template(nodes={"ocr": {"model": "det", "exec_ms": True}}),
         "dags.document.nodes.ocr.exec_ms: expected a number, got True"),
        (template(nodes={"ocr": {"model": "det"}}), "dags.document.nodes.ocr.exec_ms: missing"),
        (template(nodes={"ocr": {"model": "zz", "exec_ms": 1}}, edges=[]),
         "dags.document.nodes.ocr.model: unknown model 'zz'"),
        (template(nodes={"ocr": {"model": 3, "exec_ms": 1}}), "dags.document.nodes.ocr.model"),
        (template(nodes={"ocr": {"model": "det", "exec_ms": 1, "gpu": 1}}),
         "dags.document.nodes.ocr: unknown field 'gpu'"),
        (template(edges=[["ocr", "x"]]), "dags.document.edges[0][1]"),
        (template(edges=[["ocr"]]), "dags.document.edges[0]: expected a [from, to] pair"),
        (template(edges="ocr->cls"), "dags.document.edges: expected a list"),
        (template(nodes=[]), "dags.document.nodes: no nodes"),
        (template(nodes=[{"name": "a", "exec_ms": 1}, {"name": "a", "exec_ms": 2}], edges=[]),
         "duplicate node name 'a'"),
        (template(nodes=[{"exec_ms": 1}], edges=[]), "dags.document.nodes[0].name: missing"),
        ([1, 2], "dags.document: expected an object"),
        ({"edges": []}, "dags.document.nodes: missing"),
        (template(nodes={f"n{i}": {"exec_ms": 1} for i in range(1001)}, edges=[]), "1001 nodes"),
    ],
)
def test_dag_from_dict_errors_name_the_path(obj, message):
    with pytest.raises(DagValidationError) as info:
        dag_from_dict("document", obj, MODELS)
    assert message in str(info.value)


def test_deeply_nested_junk_is_rejected_without_recursion():
    junk: object = 1
    for _ in range(50_000):
        junk = [junk]
    with pytest.raises(DagValidationError, match="exec_ms"):
        dag_from_dict("d", template(nodes={"a": {"exec_ms": junk}}, edges=[]), MODELS)


def test_long_chain_validates_without_recursion():
    n = 1000
    nodes = {f"n{i}": {"exec_ms": 1} for i in range(n)}
    edges = [[f"n{i}", f"n{i + 1}"] for i in range(n - 1)] + [[f"n{n - 1}", "n0"]]
    with pytest.raises(DagValidationError, match="cycle through n0 -> n1"):
        dag_from_dict("chain", {"nodes": nodes, "edges": edges}, None)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=25,
)
node_like = st.fixed_dictionaries(
    {}, optional={"model": st.sampled_from(["det", "cap", "x"]) | json_values,
                  "exec_ms": st.floats() | st.integers() | json_values,
                  "output_kb": st.floats() | json_values})
template_like = st.fixed_dictionaries(
    {"nodes": st.dictionaries(st.sampled_from("abcd"), node_like, max_size=4) | json_values},
    optional={"edges": st.lists(st.lists(st.sampled_from("abcde") | json_values, max_size=3),
                                max_size=5) | json_values})


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=5), template_like | json_values)
def test_dag_from_dict_fuzz_raises_only_validation_errors(name, obj):
    try:
        d = dag_from_dict(name, obj, MODELS)
    except DagValidationError:
        return
    assert validate_dag(d, known_models=MODELS) is d
    d.topological_order()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=3), st.builds(
    TaskSpec, st.text(max_size=3), st.none() | st.text(max_size=3),
    st.floats() | st.integers(), st.floats())), st.lists(st.tuples(st.text(max_size=3),
                                                                   st.text(max_size=3))))
def test_validate_dag_fuzz(nodes, edges):
    with contextlib.suppress(DagValidationError):
        validate_dag(DagSpec(nodes=nodes, edges=tuple(edges)), known_models=MODELS)
