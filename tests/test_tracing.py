"""The per-node trace (off unless ``COMPASS_TRACE_DIR`` is set) and the wait report built
from it: what ran on a worker while an urgent successor waited there."""

from __future__ import annotations

from collections import deque

import pytest

from compass_celery import tracing as trace
from compass_celery.bench import trace_waits


@pytest.fixture
def traced(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "_recent", deque(maxlen=trace.RECENT))
    monkeypatch.setattr(trace, "_open", {})
    monkeypatch.setattr(trace, "_file", None)
    monkeypatch.setenv(trace.TRACE_ENV, str(tmp_path))
    trace.configure()
    yield tmp_path
    monkeypatch.delenv(trace.TRACE_ENV)
    trace.configure()  # closes the file, stops tracing
    assert trace._file is None and not trace.enabled()


def test_nothing_is_written_with_the_variable_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    trace.configure()
    assert not trace.enabled()
    trace.event("send", id="t1")
    trace.started("t1", "w", 9, {"id": "j", "node": "n", "sent": 1.0}, 2.0)
    assert not list(tmp_path.iterdir()) and trace._file is None


def test_the_variable_is_read_once_until_configure(tmp_path, monkeypatch):
    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    trace.configure()
    monkeypatch.setenv(trace.TRACE_ENV, str(tmp_path))
    assert not trace.enabled()  # not re-read on every call
    trace.configure()
    assert trace.enabled()
    monkeypatch.delenv(trace.TRACE_ENV)
    trace.configure()
    assert not trace.enabled()


def test_a_waits_report_names_the_batch_task_that_ran_while_a_successor_waited(traced):
    t0 = 1000.0
    # a batch step starts on this worker, then an urgent later step is sent to it
    trace.started("b1", "w", 0, {"id": "jb", "node": "translate", "sent": t0 - 0.05}, t0)
    trace.event("send", id="u1", job="ju", node="nli", level=9, snap_taken=t0 + 0.01)
    trace.ended("b1", t0 + 0.30)
    trace.started("u1", "w", 9, {"id": "ju", "node": "nli", "sent": t0 + 0.02}, t0 + 0.32)
    trace.expired("u2", "w", 9, {"id": "jx", "node": "speech", "sent": t0 + 0.25})
    lines = trace_waits.load(str(traced))
    start = next(line for line in lines if line["kind"] == "start" and line["id"] == "u1")
    (span,) = start["ran_between"]
    assert (span["id"], span["level"], span["node"]) == ("b1", 0, "translate")
    assert span["start_ms"] == pytest.approx(-20.0) and span["end_ms"] == pytest.approx(280.0)
    expired = next(line for line in lines if line["kind"] == "expired")
    assert expired["node"] == "speech" and [s["id"] for s in expired["ran_between"]] \
        == ["b1", "u1"]  # u1 still running
    report = trace_waits.report(lines, scale=0.5)
    assert "level-9 successors: 1, dropped past their latest start: 0" in report
    # 280 ms of the batch step ran during the 300 ms wait (560 workload ms at scale 0.5);
    # it started 20 ms before the send, before the snapshot the placement read (taken
    # 10 ms before the send): a wait the placement saw coming, not a stale snapshot
    assert "batch step, running at the send  " in report
    assert "started after the snapshot" not in report
    assert "560 ms" in report


def test_the_trace_waits_command_prints_the_report(traced):
    from click.testing import CliRunner

    from compass_celery.cli import compass_command

    trace.event("send", id="u1", job="ju", node="nli", level=9, snap_taken=99.99)
    trace.started("u1", "w", 9, {"id": "ju", "node": "nli", "sent": 100.0}, 100.1)
    out = CliRunner().invoke(
        compass_command, ["bench", "trace-waits", str(traced), "--time-scale", "0.5"])
    assert out.exit_code == 0, out.output
    assert "level-9 successors: 1," in out.output
    assert "wait          p50  200.0" in out.output  # 100 real ms at time scale 0.5


def test_a_compass_app_configured_after_the_variable_is_set_traces(tmp_path, monkeypatch):
    """A config module may set the variable after compass was imported: the app's
    configuration load reads it again."""
    from celery import Celery

    from compass_celery import Compass

    monkeypatch.delenv(trace.TRACE_ENV, raising=False)
    trace.configure()
    monkeypatch.setenv(trace.TRACE_ENV, str(tmp_path))
    app = Celery("traced", broker="memory://", set_as_current=False)
    Compass(app)
    app.conf.update(task_always_eager=False)
    _ = app.conf.broker_url  # configures the app
    try:
        assert trace.enabled()
    finally:
        monkeypatch.delenv(trace.TRACE_ENV)
        trace.configure()


def test_the_hops_report_times_releases_busy_gaps_and_idle_picks(traced):
    """From start, send and end lines: a successor's send after its sender's end of that
    job, a busy worker's gap from one end to the next pick of a task sent before that
    end, and an idle worker's pick after the send (workload ms at scale 0.5)."""
    t0 = 1000.0
    trace.started("j.a", "w", 0, {"id": "j", "node": "a", "sent": t0 - 0.01}, t0)
    trace.started("k.c", "w2", 0, {"id": "k", "node": "c", "sent": t0 - 0.02}, t0 - 0.01)
    trace.ended("k.c", t0 - 0.005)
    trace.ended("j.a", t0 + 0.100)
    trace.event("send", t=t0 + 0.104, id="j.b", job="j", by="w", node="b", level=0)
    trace.started("j.b", "w2", 0, {"id": "j", "node": "b", "sent": t0 + 0.104}, t0 + 0.110)
    trace.started("m.d", "w", 0, {"id": "m", "node": "d", "sent": t0 + 0.05}, t0 + 0.108)
    for tid, at in (("j.b", t0 + 0.2), ("m.d", t0 + 0.3)):
        trace.ended(tid, at)
    hops = trace_waits.hop_times(trace_waits.load(str(traced)), scale=0.5)
    assert hops["release"] == [pytest.approx(8.0)]
    assert hops["busy gap"] == [pytest.approx(16.0)]
    assert sorted(hops["idle pick"]) == pytest.approx([12.0, 20.0, 20.0])  # b; a, c
    assert "busy gap   n=   1  p50   16.0" in trace_waits.hops_report(
        trace_waits.load(str(traced)), 0.5)
