"""Workload parsing: the shared example loads, every error names its field, fuzzing is safe."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass_celery.workload import (
    WorkloadError,
    arrival_times_ms,
    job_stream,
    load_workload,
    lower_bound_ms,
    parse_workload,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "edge-vision.json"
FILES = sorted((ROOT / "dags").glob("*.json"))

BASE = {
    "name": "tiny",
    "models": {"det": {"size_mb": 250}, "cap": 900},
    "dags": {"pipe": {"nodes": {"d": {"model": "det", "exec_ms": 30, "output_kb": 40},
                                "c": {"model": "cap", "exec_ms": 120}},
                      "edges": [["d", "c"]]}},
    "mix": {"pipe": 1},
    "cluster": {"workers": 2, "gpu_mem_mb": 1600, "load_mb_per_s": 1500, "net_mb_per_s": 1000},
    "arrivals": {"process": "poisson", "rate_per_s": 5, "jobs": 20, "seed": 3},
}


def doc(**changes):
    out = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        target = out
        for part in head:
            target = target[part]
        if value is ...:
            del target[last]
        else:
            target[last] = value
    return out


def test_shared_example_loads():
    if not EXAMPLE.exists():
        pytest.skip("shared example workload not present")
    w = load_workload(EXAMPLE)
    assert w.name == "edge-vision" and len(w.cluster.workers) == 4
    assert w.models["captioner"] == 950 and set(w.mix) == set(w.dags)
    assert w.arrivals.process == "poisson" and w.arrivals.jobs == 400
    assert lower_bound_ms(w.dags["caption_translate"], w) == 210


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_repo_workloads_load(path):
    w = load_workload(path)
    assert w.dags and len(job_stream(w, jobs=50)) == 50


def test_yaml_and_json_agree(tmp_path):
    yaml = pytest.importorskip("yaml")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "a.json").write_text(json.dumps(BASE))
    assert load_workload(tmp_path / "a.yaml") == load_workload(tmp_path / "a.json")


def test_heterogeneous_cluster_and_scaling():
    w = parse_workload(doc(cluster=[{"name": "big", "gpu_mem_mb": 4000, "speed": 2},
                                    {"gpu_mem_mb": 1000, "count": 3}]))
    assert [x.name for x in w.cluster.workers] == ["big", "w001-0", "w001-1", "w001-2"]
    assert w.cluster.workers[0].speed == 2 and w.cluster.largest_gpu_mb == 4000
    scaled = w.cluster.scaled(10)
    assert len(scaled.workers) == 10 and scaled.workers[4].gpu_mem_mb == 4000
    assert lower_bound_ms(w.dags["pipe"], w) == 75


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"models__cap": 5000}, "models.cap: 5000 MB does not fit on any worker"),
        ({"models__cap": {"size_mb": "big"}}, "models.cap.size_mb: expected a number, got 'big'"),
        ({"models__cap": {"size": 1}}, "models.cap: unknown field 'size'"),
        ({"models__cap": -1}, "models.cap: must be above 0"),
        ({"models__cap": True}, "models.cap: expected a number, got True"),
        ({"models": {}}, "models: no models"),
        ({"dags__pipe__nodes__c__exec_ms": "fast"},
         "dags.pipe.nodes.c.exec_ms: expected a number, got 'fast'"),
        ({"dags__pipe__nodes__c__model": "zz"}, "dags.pipe.nodes.c.model: unknown model 'zz'"),
        ({"dags__pipe__edges": [["c", "d"], ["d", "c"]]}, "cycle"),
        ({"mix": {"nope": 1}}, "mix.nope: unknown DAG"),
        ({"mix": {"pipe": 0}}, "mix.pipe: must be above 0"),
        ({"mix": {"pipe": float("nan")}}, "mix.pipe: expected a finite number"),
        ({"cluster__workers": 0}, "cluster.workers: must be between 1"),
        ({"cluster__workers": 2.5}, "cluster.workers: expected an integer"),
        ({"cluster__gpu_mem_mb": ...}, "cluster.gpu_mem_mb: missing"),
        ({"cluster__net_mb_per_s": "x"}, "cluster.net_mb_per_s: expected a number"),
        ({"cluster__gpus": 1}, "cluster: unknown field 'gpus'"),
        ({"cluster": [{"gpu_mem_mb": 1600, "speed": 0}]}, "cluster[0].speed: must be above 0"),
        ({"cluster": [{"name": "a", "gpu_mem_mb": 1600}] * 2}, "duplicate worker name 'a'"),
        ({"cluster": []}, "cluster: no workers"),
        ({"cluster": "big"}, "cluster: expected an object or a list"),
        ({"arrivals__process": "uniform"}, "arrivals.process: expected 'poisson'"),
        ({"arrivals__rate_per_s": float("inf")}, "arrivals.rate_per_s: expected a finite"),
        ({"arrivals__jobs": ...}, "arrivals.jobs: missing"),
        ({"arrivals__jobs": True}, "arrivals.jobs: expected an integer"),
        ({"arrivals": {"process": "bursty", "rate_per_s": 5, "jobs": 3}}, "arrivals.on_s: missing"),
        ({"arrivals": {"process": "explicit", "times_ms": [0, "x"]}}, "arrivals.times_ms[1]"),
        ({"arrivals": {"process": "explicit", "times_ms": []}}, "arrivals.times_ms"),
        ({"seed": "s"}, "seed: expected an integer"),
        ({"extra": 1}, "workload: unknown field 'extra'"),
        ({"dags": ...}, "dags: missing"),
        ({"description": 5}, "description: expected a string"),
    ],
)
def test_errors_name_the_field(changes, needle):
    with pytest.raises(WorkloadError) as info:
        parse_workload(doc(**changes))
    assert needle in str(info.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{" * 100_000)
    with pytest.raises(WorkloadError, match="not valid JSON"):
        load_workload(bad)
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(bad)


def test_arrivals_are_seeded_and_overridable():
    w = parse_workload(doc())
    a, b = arrival_times_ms(w.arrivals), arrival_times_ms(w.arrivals)
    assert a == b and len(a) == 20 and a == sorted(a)
    assert len(arrival_times_ms(w.arrivals, jobs=7)) == 7
    fast = arrival_times_ms(w.arrivals, rate=50, jobs=2000)
    assert 35 < 2000 / (fast[-1] / 1000) < 65
    assert job_stream(w) == job_stream(w) and {n for _, n in job_stream(w)} == {"pipe"}


def test_bursty_arrivals_fall_in_on_windows():
    w = parse_workload(doc(arrivals={"process": "bursty", "rate_per_s": 100, "jobs": 500,
                                     "on_s": 1, "off_s": 2, "seed": 1}))
    times = arrival_times_ms(w.arrivals)
    assert all(t % 3000 < 1000 for t in times) and times[-1] > 3000


def test_explicit_arrivals_and_mix_draw():
    w = parse_workload(doc(arrivals={"process": "explicit", "times_ms": [30, 0, 10]},
                           dags={"a": BASE["dags"]["pipe"], "b": BASE["dags"]["pipe"]},
                           mix={"a": 3, "b": 1}))
    assert arrival_times_ms(w.arrivals) == [0, 10, 30]
    assert w.mix == {"a": 0.75, "b": 0.25}
    with pytest.raises(WorkloadError, match="jobs"):
        arrival_times_ms(w.arrivals, jobs=4)
    many = parse_workload(doc(dags={"a": BASE["dags"]["pipe"], "b": BASE["dags"]["pipe"]},
                              mix={"a": 3, "b": 1}))
    names = [n for _, n in job_stream(many, jobs=4000)]
    assert 0.7 < names.count("a") / len(names) < 0.8


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=30,
)
SECTIONS = ["name", "models", "dags", "mix", "cluster", "arrivals", "seed", "description"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(SECTIONS), json_values) | json_values)
def test_parse_workload_fuzz_raises_only_workload_errors(obj):
    with contextlib.suppress(WorkloadError):
        parse_workload(obj)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SECTIONS), st.data())
def test_mutated_section_raises_only_workload_errors(section, data):
    obj = copy.deepcopy(BASE)
    target = obj
    path = [section]
    while isinstance(target.get(path[-1]), dict) and data.draw(st.booleans()):
        target = target[path[-1]]
        path.append(data.draw(st.sampled_from(sorted(target))))
    target[path[-1]] = data.draw(json_values)
    with contextlib.suppress(WorkloadError):
        job_stream(parse_workload(obj), jobs=5)


def test_bandwidth_defaults_are_the_planners_everywhere():
    from compass_celery.cache.backends import EmulatedBackend
    from compass_celery.planner.types import (
        DEFAULT_HOST_LOAD_MB_PER_S,
        DEFAULT_LOAD_MB_PER_S,
        DEFAULT_NET_MB_PER_S,
        WorkerView,
    )
    from compass_celery.settings import OPTIONS

    want = {"load_mb_per_s": DEFAULT_LOAD_MB_PER_S, "net_mb_per_s": DEFAULT_NET_MB_PER_S,
            "host_load_mb_per_s": DEFAULT_HOST_LOAD_MB_PER_S}
    spec = parse_workload(doc(cluster={"workers": 1, "gpu_mem_mb": 1600})).cluster.workers[0]
    view = WorkerView("w", "q", 1.0, 1.0)
    gpu = EmulatedBackend(1.0)
    for field, value in want.items():
        assert getattr(spec, field) == getattr(view, field) == OPTIONS[field].default == value
    assert (gpu.load_mb_per_s, gpu.host_load_mb_per_s) == (want["load_mb_per_s"],
                                                          want["host_load_mb_per_s"])


def test_dag_template_errors_are_workload_errors_naming_dag_node_and_field():
    with pytest.raises(WorkloadError, match=r"dags\.pipe\.nodes\.c\.output_kb: must be at "
                                            r"least 0") as info:
        parse_workload(doc(dags__pipe__nodes__c__output_kb=-1))
    assert type(info.value.__cause__).__name__ == "DagValidationError"
