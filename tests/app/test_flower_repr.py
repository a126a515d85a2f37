"""The placement rides on ``kwargsrepr``, which Flower shows as the task's kwargs.

No Redis: rendering is pure, and the publish path runs on an in-memory broker with
in-process worker state.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, signals

from compass_celery import Compass
from compass_celery.flower import annotate_headers, describe_placement
from compass_celery.jobs.keys import INPUT_REF, JOB_HEADER
from compass_celery.jobs.send import publish_node
from compass_celery.placement import Decision
from compass_celery.testing import add_worker

HEADER = Decision(task="t.caption", model="captioner", worker="gpu0", queue="compass.w.gpu0",
                  policy="compass", charge_ms=120.0, est_finish_ms=753.4, load_ms=633.0,
                  run_ms=120.0, reason="least finish 753ms (load 633ms)").as_header()


def test_describe_placement_names_every_field() -> None:
    line = describe_placement(HEADER, {"moved_from": None})
    assert line == ("compass: worker=gpu0 model=captioner policy=compass est_finish=753ms "
                    "moved_from=- reason=least finish 753ms (load 633ms)")
    assert "moved_from=gpu1" in describe_placement(HEADER, {"moved_from": "gpu1"})


def test_describe_placement_survives_missing_and_odd_fields() -> None:
    assert describe_placement({}) == ("compass: worker=- policy=- est_finish=- moved_from=- "
                                      "reason=-")
    assert describe_placement(None, "not a dict") == describe_placement({})
    line = describe_placement({"worker": "*", "est_finish_ms": "soon", "fallback": True,
                               "reason": "no live\ncompass worker " + "x" * 500})
    assert "worker=shared" in line and "est_finish=-" in line and "fallback=yes" in line
    assert "\n" not in line and len(line) < 220 and line.endswith("...")


def test_annotate_keeps_the_kwargs_repr_in_front() -> None:
    headers: dict[str, Any] = {"kwargsrepr": "{'x': 1}", "compass": HEADER,
                               JOB_HEADER: {"id": "j", "node": "b", "moved_from": "gpu1"}}
    annotate_headers(headers)
    assert headers["kwargsrepr"].startswith("{'x': 1} | compass: worker=gpu0 ")
    assert "moved_from=gpu1" in headers["kwargsrepr"]
    # a re-placed retry re-annotates: the old placement is replaced, not stacked
    headers["compass"] = {**HEADER, "worker": "gpu2"}
    annotate_headers(headers)
    assert headers["kwargsrepr"].count("compass:") == 1
    assert headers["kwargsrepr"].startswith("{'x': 1} | compass: worker=gpu2 ")


def test_annotate_leaves_other_messages_alone() -> None:
    headers: dict[str, Any] = {"kwargsrepr": "{}", "compass": None}
    annotate_headers(headers)
    assert headers == {"kwargsrepr": "{}", "compass": None}
    bare: dict[str, Any] = {"compass": HEADER}  # no kwargsrepr (protocol 1): set it
    annotate_headers(bare)
    assert bare["kwargsrepr"].startswith("compass: worker=gpu0")


@pytest.fixture
def sent_headers() -> Any:
    """Headers of every message published meanwhile, as the broker would get them."""
    seen: list[dict[str, Any]] = []

    def capture(sender: Any = None, headers: dict | None = None, **kw: Any) -> None:
        seen.append(dict(headers or {}))

    yield seen, capture
    signals.before_task_publish.disconnect(capture)


def test_a_routed_task_and_a_successor_carry_the_placement(sent_headers: Any) -> None:
    seen, capture = sent_headers
    app = Celery("repr", broker="memory://", set_as_current=False)  # not eager: it publishes
    app.conf.compass_models = {"captioner": 950}
    compass = Compass(app)
    signals.before_task_publish.connect(capture)  # after Compass's own receiver

    @app.task(shared=False, name="t.caption", compass_model="captioner", compass_exec_ms=120)
    def caption(text: str, lang: str = "en") -> str:
        return text

    add_worker(app, "gpu0", gpu_mb=1600, resident=["captioner"])
    add_worker(app, "gpu1", gpu_mb=1600)
    result = caption.apply_async(("a cat",), {"lang": "fr"})
    decision = compass.placement(result.id)
    assert decision is not None and decision.worker == "gpu0"
    (headers,) = [h for h in seen if h.get("id") == result.id]
    assert headers["kwargsrepr"].startswith("{'lang': 'fr'} | compass: worker=gpu0 ")
    for field in ("policy=compass", "est_finish=", "moved_from=-", "reason="):
        assert field in headers["kwargsrepr"]

    # what publish_node sends: an explicit queue (the router stays out), its own headers
    job = {"id": "job1", "node": "b", "moved_from": "gpu0", "planned": "gpu0"}
    app.send_task("t.caption", args=["a dog"], kwargs={}, queue="compass.w.gpu1",
                  task_id="succ-1", headers={"compass": {**HEADER, "worker": "gpu1"},
                                             JOB_HEADER: job})
    (succ,) = [h for h in seen if h.get("id") == "succ-1"]
    assert succ["kwargsrepr"].startswith("{} | compass: worker=gpu1 ")
    assert "moved_from=gpu0" in succ["kwargsrepr"]


def test_the_task_list_shows_a_short_placement_in_front_of_the_args() -> None:
    headers = {"compass": HEADER, "argsrepr": "('a cat',)", "kwargsrepr": "{}"}
    annotate_headers(headers, ["a cat"])
    assert headers["argsrepr"] == "[gpu0 · captioner · 753ms] ('a cat',)"
    annotate_headers(headers, ["a cat"])  # a re-placed retry: replaced, not stacked
    assert headers["argsrepr"] == "[gpu0 · captioner · 753ms] ('a cat',)"
    shared = {"compass": {**HEADER, "worker": "*", "est_finish_ms": None}, "argsrepr": "()"}
    annotate_headers(shared, [])
    assert shared["argsrepr"] == "[shared · captioner · -] ()"


def test_a_dag_node_shows_where_its_inputs_come_from_not_the_plumbing() -> None:
    ref = {INPUT_REF: {"preds": ["detect", "ocr"], "single": False}}
    headers = {"compass": HEADER, "argsrepr": repr((ref, 3)), "kwargsrepr": "{}"}
    annotate_headers(headers, [ref, 3])
    assert headers["argsrepr"] == "[gpu0 · captioner · 753ms] (<outputs of detect, ocr>, 3)"
    assert "__compass_inputs__" not in headers["argsrepr"]


def test_a_task_with_a_deadline_shows_its_class_and_how_long_it_had() -> None:
    timed = Decision(task="t.caption", model="captioner", worker="gpu0", queue="compass.w.gpu0",
                     policy="compass", charge_ms=120.0, est_finish_ms=180.0, reason="resident",
                     queued_at=1000.0, slo="interactive", due=1000.4,
                     expires_at=1000.22).as_header()
    line = describe_placement(timed)
    assert "slo=interactive due_in=400ms reason=resident" in line and "late" not in line
    headers = {"compass": timed, "argsrepr": "('a cat',)", "kwargsrepr": "{}"}
    annotate_headers(headers, ["a cat"])
    assert headers["argsrepr"] == ("[gpu0 · captioner · 180ms · interactive due in 400ms] "
                                   "('a cat',)")
    late = {**timed, "late": True, "slo": ""}  # a bare deadline_ms: no class
    assert "due_in=400ms late=yes" in describe_placement(late)
    assert "slo=" not in describe_placement(late)
    annotate_headers(headers, ["a cat"])  # re-annotated: still one short form in front
    assert headers["argsrepr"].count("[") == 1
    # no deadline: nothing added; odd fields from an older producer: nothing added
    assert "due_in" not in describe_placement(HEADER) and "slo=" not in describe_placement(HEADER)
    assert "due_in" not in describe_placement({**timed, "due": "soon"})


def test_a_successor_is_shown_as_celery_would_show_it_with_its_reprs_given(
        sent_headers: Any) -> None:
    """publish_node hands Celery a successor's argsrepr and kwargsrepr ready-made (its
    saferepr of an input reference cost ~45 us a hop): what the message carries is what
    Celery's own reprs, annotated, gave; the reprs stay out of its properties."""
    seen, _ = sent_headers
    props: list[dict[str, Any]] = []

    def capture(sender: Any = None, headers: dict | None = None,
                properties: dict | None = None, **kw: Any) -> None:
        seen.append(dict(headers or {}))
        props.append(dict(properties or {}))

    app = Celery("repr2", broker="memory://", set_as_current=False)
    app.conf.compass_models = {"captioner": 950}
    compass = Compass(app)
    signals.before_task_publish.connect(capture)
    try:
        add_worker(app, "gpu1", gpu_mb=1600)
        ref = {INPUT_REF: {"preds": ["detect", "ocr"], "single": False}}
        node = {"task": "t.caption", "model": "captioner", "exec_ms": 120.0,
                "args": ["x", 3], "kwargs": {}, "preds": ["detect", "ocr"]}
        where = {"worker": "gpu1", "queue": "compass.w.gpu1", "finish_ms": 753.0,
                 "load_ms": 0.0, "run_ms": 120.0, "start_ms": 0.0, "reason": "r"}
        publish_node(compass, "job1", "b", node, where, ref, None, "succ-new")
        # the same message as Celery would build it, its reprs its own
        job = {"id": "job1", "node": "b", "sent": 1.0, "moved_from": None, "planned": "gpu1"}
        header = compass.placement("succ-new").as_header()
        app.send_task("t.caption", args=[ref, "x", 3], kwargs={}, queue="compass.w.gpu1",
                      task_id="succ-old", headers={"compass": header, JOB_HEADER: job})
    finally:
        signals.before_task_publish.disconnect(capture)
    (new,) = [h for h in seen if h.get("id") == "succ-new"]
    (old,) = [h for h in seen if h.get("id") == "succ-old"]
    assert new["argsrepr"] == old["argsrepr"] \
        == "[gpu1 · captioner · 753ms] (<outputs of detect, ocr>, 'x', 3)"
    assert new["kwargsrepr"] == old["kwargsrepr"]
    assert new["kwargsrepr"].startswith("{} | compass: worker=gpu1 ")
    assert all("argsrepr" not in p and "kwargsrepr" not in p for p in props)
