"""The ``compass`` header a decision writes: every field, by name, and only the fields,
however the decision was made (constructed, evolved on the hot path, re-placed)."""

from __future__ import annotations

from dataclasses import asdict, fields

from compass_celery.placement import Decision
from compass_celery.planner.cost import evolve


def _placed() -> Decision:
    return Decision(task="t", model="m", worker="w1", queue="q1", policy="compass",
                    charge_ms=12.0, est_finish_ms=40.0, run_ms=10.0, exec_ms=10.0)


def test_header_of_evolved_and_replaced_decisions_is_every_field_in_order() -> None:
    names = [f.name for f in fields(Decision)]
    evolved = evolve(_placed(), priority=7, queued_at=1.5, slo="gold", due=9.0)
    moved = evolved.replaced(Decision(task="t", model="m", worker="w2", queue="q2",
                                      policy="compass", charge_ms=3.0))
    for d in (_placed(), evolved, moved):
        header = d.as_header()
        assert header == asdict(d)
        assert list(header) == names  # nothing but the fields, in declaration order
        assert Decision.from_header(header) == d
    assert moved.as_header()["worker"] == "w2" and moved.as_header()["priority"] == 7


def test_header_is_a_copy_the_decision_does_not_share() -> None:
    d = evolve(_placed(), priority=3)
    header = d.as_header()
    header["worker"] = "elsewhere"
    header["extra"] = 1
    assert d.worker == "w1" and "extra" not in d.as_header()


def test_from_header_reads_this_version_an_older_one_and_refuses_a_broken_one() -> None:
    d = evolve(_placed(), priority=5, batch="k")
    newer = {**d.as_header(), "future_field": 1}  # a later version's extra field
    back = Decision.from_header(newer)
    assert back == d and hash(back) == hash(d) and list(back.as_header()) == list(d.as_header())
    assert not hasattr(back, "future_field")
    v1 = {k: v for k, v in d.as_header().items() if k not in ("exec_ms", "v")}
    old = Decision.from_header(v1)  # written before exec_ms was carried
    assert old is not None and old.exec_ms == 0.0 and old.v == 2 and old.planned_exec_ms == 10.0
    broken = {k: v for k, v in d.as_header().items() if k != "worker"}
    assert Decision.from_header(broken) is None
    assert Decision.from_header("not a dict") is None
