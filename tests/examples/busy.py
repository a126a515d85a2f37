"""A task that keeps a worker busy, for the examples' deadline tests.

The worker imports it with ``--include tests.examples.busy``; the test process imports
it too (``shared_task`` binds it to every app), so it can send it. Its run time is
declared per call (``compass={"exec_ms": ...}``): truthfully, so the planner sees the
backlog and refuses what cannot meet its deadline, or understated, so a job is taken
and then falls behind.
"""

from __future__ import annotations

import time

from celery import shared_task

HOLD = "tests.examples.busy.hold"


@shared_task(name=HOLD, compass_model="detector", compass_exec_ms=1)
def hold(seconds: float) -> float:
    """Keep the worker (a solo pool: nothing else runs meanwhile) busy for ``seconds``."""
    time.sleep(seconds)
    return seconds
