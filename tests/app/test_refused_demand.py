"""What a producer refuses for want of capacity is demand: it is tracked with its class
and planned on with what the workers served (compass_celery.refused)."""

from __future__ import annotations

from compass_celery import refused
from compass_celery.planner.types import ModelDemand
from compass_celery.settings import CompassSettings, resolve


class _Context:
    """The one setting the tracker reads."""

    settings: CompassSettings = resolve({"compass_time_scale": 1.0})


def test_refusals_are_demand_with_their_class_once_the_tracker_is_of_age() -> None:
    c = _Context()
    served = {"qa": ModelDemand(400.0, 4.0)}
    assert refused.refused(c) == {} and refused.with_refused(c, served) is served
    now = [100.0]
    refused.tracker(c).clock = lambda: now[0]
    for k in range(60):  # two refused a second for 30 s, under a deadline
        now[0] = 100.0 + k * 0.5
        refused.note(c, [("qa", 300.0), (None, 5.0)], urgent=True)
    rates = refused.refused(c)
    assert set(rates) == {"qa"}
    assert 1.5 < rates["qa"].per_s < 2.5 and rates["qa"].urgent_per_s == rates["qa"].per_s
    total = refused.with_refused(c, served)["qa"]
    assert total.per_s == 4.0 + rates["qa"].per_s
    assert total.urgent_per_s == rates["qa"].urgent_per_s
    # another app in the same process keeps its own
    assert refused.refused(_Context()) == {}
