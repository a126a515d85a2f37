"""The regression gate's verdict (the gate itself runs outside pytest: timings flake)."""

from __future__ import annotations

from click.testing import CliRunner

from compass_celery.bench.regress import judge, report
from compass_celery.cli import compass_command


def test_a_timing_is_slower_only_beyond_the_spread_and_the_tolerance():
    base = {"route us": [100.0, 104.0, 98.0], "sim wall s": [10.0, 10.2, 10.1],
            "plan ms": [1.0, 1.0, 1.0]}
    today = {"route us": [107.0, 103.0, 105.0], "sim wall s": [14.0, 14.1, 13.9],
             "plan ms": [0.5, 0.5, 0.5]}
    words = {v.metric: v.word for v in judge(base, today, tolerance=0.05)}
    # 105 vs 100: within the rounds' spread (6) -> same; 14 vs 10.1 -> slower
    assert words == {"route us": "same", "sim wall s": "slower", "plan ms": "faster"}


def test_a_result_that_differs_is_changed_not_slower():
    verdicts = judge({"result w mean ms": [5.0, 5.0], "x s": [1.0]},
                     {"result w mean ms": [5.0, 6.0], "y s": [1.0]})
    words = {v.metric: v.word for v in verdicts}
    assert words == {"result w mean ms": "changed", "x s": "missing", "y s": "missing"}
    lines: list[str] = []
    assert report(verdicts, lines.append)  # changed and missing are not slowdowns
    assert "results changed: result w mean ms" in lines[-1]


def test_the_hosts_own_timings_are_never_a_slowdown_and_are_printed():
    verdicts = judge({"host python loop s": [0.10, 0.10], "route us": [100.0, 100.0]},
                     {"host python loop s": [0.25, 0.25], "route us": [100.0, 100.0]})
    words = {v.metric: v.word for v in verdicts}
    assert words == {"host python loop s": "host", "route us": "same"}
    lines: list[str] = []
    assert report(verdicts, lines.append)  # the host 2.5x slower: not the code's slowdown
    assert "host (base / today medians): python loop s 0.1 / 0.25" in lines
    assert lines[-1] == "verdict: no slowdown"


def test_report_fails_on_a_slowdown():
    lines: list[str] = []
    assert not report(judge({"t s": [1.0, 1.0]}, {"t s": [2.0, 2.0]}), lines.append)
    assert lines[-1] == "verdict: SLOWER: t s"


def test_the_gate_is_a_subcommand():
    result = CliRunner().invoke(compass_command, ["regress", "--help"])
    assert result.exit_code == 0 and "--base" in result.output
