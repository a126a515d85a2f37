"""The soak benchmark's pure parts: reading /proc, and when a level counts as flat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compass_celery.bench.soak import (
    Counts,
    backlog_note,
    descendants,
    fill_s,
    flat,
    job_kind,
    level,
    parse_ppid,
    parse_vmrss_kb,
    slope_per_min,
    summary,
    tree_rss_kb,
    verdict,
    windows,
)

STATUS = """Name:\tcelery
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  412340 kB
VmRSS:\t   98304 kB
RssAnon:\t   80000 kB
Threads:\t7
"""


def test_vmrss_is_read_in_kb_and_absent_for_a_kernel_thread() -> None:
    assert parse_vmrss_kb(STATUS) == 98304
    assert parse_vmrss_kb("Name:\tkthreadd\nState:\tS (sleeping)\n") is None
    assert parse_vmrss_kb("VmRSS:\n") is None


def test_ppid_is_read_after_a_command_name_with_spaces_and_parentheses() -> None:
    assert parse_ppid("4242 (celery) S 17 4242 4242 0 -1 4194560") == 17
    assert parse_ppid("4243 (a (b) c) R 4242 4242 4242 0 -1") == 4242
    assert parse_ppid("garbled") is None


def test_descendants_is_the_whole_tree_and_nothing_else() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert descendants(10, parents) == {10, 11, 12, 13}
    assert descendants(12, parents) == {12}


def _proc(root: Path, pid: int, ppid: int, rss_kb: int | None) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} (python -m celery) S {ppid} {pid} {pid} 0 -1\n")
    rss = f"VmRSS:\t{rss_kb} kB\n" if rss_kb is not None else ""
    (d / "status").write_text(f"Name:\tpython\n{rss}")


def test_tree_rss_sums_the_tree_from_a_proc_directory(tmp_path: Path) -> None:
    _proc(tmp_path, 100, 1, 50_000)
    _proc(tmp_path, 101, 100, 20_000)
    _proc(tmp_path, 102, 101, None)  # a zombie: no VmRSS
    _proc(tmp_path, 200, 1, 999_999)  # another tree
    (tmp_path / "self").mkdir()  # not a pid
    assert tree_rss_kb(100, str(tmp_path)) == 70_000
    assert tree_rss_kb(101, str(tmp_path)) == 20_000
    assert tree_rss_kb(300, str(tmp_path)) is None  # gone


def test_tree_rss_of_this_process_is_positive() -> None:
    import os

    assert (tree_rss_kb(os.getpid()) or 0) > 0


def test_the_fill_is_the_longest_expiry_job_records_or_once_guards() -> None:
    assert fill_s(30.0, 10.0) == 70.0  # the guards outlive a short job TTL
    assert fill_s(600.0, 10.0) == 600.0


def test_windows_leave_out_the_first_ttl_and_split_at_the_middle() -> None:
    pts = [(float(t), float(t)) for t in range(0, 101, 10)]
    a, b = windows(pts, 40.0, 100.0)
    assert [t for t, _ in a] == [40.0, 50.0, 60.0]
    assert [t for t, _ in b] == [70.0, 80.0, 90.0, 100.0]


def test_slope_is_per_minute() -> None:
    assert slope_per_min([(0.0, 10.0), (30.0, 11.0), (60.0, 12.0)]) == pytest.approx(2.0)
    assert slope_per_min([(5.0, 1.0)]) is None


def _plateau(t: float, ttl: float, top: float) -> float:
    """A level that fills for one TTL, then holds, with a little jitter."""
    return top * min(1.0, t / ttl) + (3.0 if int(t) % 20 == 0 else 0.0)


def test_a_plateau_after_the_ttl_is_flat_though_it_rose_before() -> None:
    pts = [(float(t), _plateau(t, 60, 1000)) for t in range(0, 601, 5)]
    lv = level("keys", "keys", pts, 60.0, 600.0, (0.10, 20.0))
    assert lv.flat is True
    assert lv.max_a == pytest.approx(1003.0) and lv.max_b == pytest.approx(1003.0)
    assert abs(lv.slope_per_min or 0.0) < 1.0


def test_a_leak_after_the_ttl_is_growing() -> None:
    # a plateau of 1000 keys plus 60 keys a minute that never expire
    pts = [(float(t), _plateau(t, 60, 1000) + t) for t in range(0, 601, 5)]
    lv = level("keys", "keys", pts, 60.0, 600.0, (0.10, 20.0))
    assert lv.flat is False
    assert lv.slope_per_min == pytest.approx(60.0, rel=0.05)


def test_a_slow_leak_within_the_tolerance_passes_but_shows_in_the_slope() -> None:
    pts = [(float(t), 100.0 + t / 60) for t in range(0, 601, 5)]  # 1 MB/min on 100 MB
    lv = level("RSS w", "MB", pts, 60.0, 600.0, (0.10, 0.5))
    assert lv.flat is True
    assert lv.slope_per_min == pytest.approx(1.0)
    assert "+1.000 MB/min" in lv.line()


def test_too_few_samples_after_the_ttl_is_inconclusive_not_flat() -> None:
    pts = [(float(t), 1.0) for t in range(0, 70, 10)]
    lv = level("keys", "keys", pts, 60.0, 60.0, (0.1, 0.0))
    assert lv.flat is None
    assert "inconclusive" in lv.line()


def _sample(t: float, keys: int | None, mem: int | None, rss: dict[str, int],
            phase: str = "run", in_flight: int = 3) -> dict[str, Any]:
    return {"t": t, "phase": phase, "keys": keys, "job_keys": keys, "used_memory": mem,
            "rss_kb": rss, "in_flight": in_flight, "submitted": 0, "ended": 0}


def _samples(leak_rss: bool = False, backlog: bool = False) -> list[dict[str, Any]]:
    out = []
    for t in range(0, 301, 5):
        keys = int(500 * min(1.0, t / 30))
        rss = {"s0@soak": 100_000, "s1@soak": 100_000 + (t * 200 if leak_rss else 0)}
        down = t == 150  # Redis restarting: no reading
        out.append(_sample(float(t), None if down else keys,
                           None if down else 2**20 + keys * 1000, rss,
                           in_flight=t if backlog else 3))
    out += [_sample(305.0 + t, 10, 2**20, {"s0@soak": 100_000, "s1@soak": 100_000},
                    phase="drain", in_flight=0) for t in range(0, 40, 5)]
    return out


def test_the_verdict_judges_keys_memory_and_each_worker_and_skips_down_samples() -> None:
    v = verdict(_samples(), 30.0)
    assert set(v) == {"keys", "used_memory", "rss s0@soak", "rss s1@soak"}
    assert all(lv.flat for lv in v.values())
    assert v["used_memory"].unit == "MB" and v["used_memory"].max_b == pytest.approx(
        (2**20 + 500_000) / 2**20)
    assert v["rss s0@soak"].max_a == pytest.approx(100_000 / 1024)


def test_a_growing_worker_fails_the_verdict_alone() -> None:
    v = verdict(_samples(leak_rss=True), 30.0)
    assert v["rss s0@soak"].flat is True
    assert v["rss s1@soak"].flat is False
    assert v["rss s1@soak"].slope_per_min == pytest.approx(12_000 / 1024, rel=0.01)
    assert v["keys"].flat is True


def test_the_drain_is_not_judged() -> None:
    samples = _samples()
    for s in samples:
        if s["phase"] == "drain":
            s["keys"] = 100_000  # would fail the rule were it judged
    assert verdict(samples, 30.0)["keys"].flat is True


def test_a_backlog_is_told_apart_from_a_leak() -> None:
    assert backlog_note(_samples(), 30.0) is None
    assert "do not keep up" in (backlog_note(_samples(backlog=True), 30.0) or "")


def test_counts_in_flight_is_admitted_minus_ended() -> None:
    c = Counts()
    for what in ["submitted"] * 6 + ["rejected", "ok", "shed", "failed"]:
        c.add(what)
    snap = c.snapshot()
    assert snap["ended"] == 3 and snap["in_flight"] == 2
    assert "lock" not in snap


def test_the_job_mix_has_every_kind() -> None:
    kinds = {job_kind(i) for i in range(100)}
    assert kinds == {"failing", "refused", "tight", "big", "diamond", "chain"}


def test_summary_and_exit_status() -> None:
    samples = _samples()
    v = verdict(samples, 30.0)
    from dataclasses import asdict

    result = {"options": {"minutes": 5.0, "job_ttl_s": 30.0}, "samples": samples,
              "base": {"keys": 12, "used_memory": 2**20}, "events": [
                  {"t": 150.0, "event": "redis restart"}],
              "counts": Counts().snapshot(), "verdict": {k: asdict(x) for k, x in v.items()},
              "backlog": None, "dead_workers": [], "worker_logs": "/tmp/x",
              "fill_s": 30.0}
    text = summary(result)
    assert "| t (s) |" in text and "FLAT" in text and "event at 150 s: redis restart" in text
    assert "after the drain (40 s without jobs): 10 keys" in text
    assert flat(result)
    result["verdict"]["keys"]["flat"] = None  # inconclusive is not a pass
    assert not flat(result)
