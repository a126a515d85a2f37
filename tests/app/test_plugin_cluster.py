"""``compass_cluster`` starts real workers of an app module and waits until they are live."""

from __future__ import annotations

import pytest

from compass_celery.jobs.dag import Dag
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis


def test_compass_cluster_runs_a_job_on_live_workers(compass_redis_url, compass_cluster):
    app = make_app(compass_redis_url, compass_snapshot_ttl_s=0.0)
    cluster = compass_cluster(app, "tests.support.jobapp", n=2, preload="small",
                              env={"COMPASS_BROKER_URL": compass_redis_url})
    assert len(cluster.names) == 2 and all(w.alive() for w in cluster.workers)
    dag = Dag(app, "plugin")
    a = dag.node("a", app.tasks["j.src"].s(4))
    dag.node("b", app.tasks["j.add"].s(1), after=[a])
    job = dag.apply_async()
    assert job.get(timeout=20) == {"b": 5}, cluster.logs()
    assert {p["worker"] for p in job.placement().values()} <= set(cluster.names)
