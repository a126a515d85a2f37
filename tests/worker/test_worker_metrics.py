"""``--compass-metrics-port``: a real worker serves Prometheus metrics in base units."""

from __future__ import annotations

import urllib.request

import pytest

from compass_celery.local import free_port, wait_until
from compass_celery.testing import worker_logs
from tests.support.cluster import start

pytestmark = pytest.mark.redis
pytest.importorskip("prometheus_client")


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_a_worker_serves_metrics_on_its_port(compass_redis_url, compass_workers):
    port = free_port()
    app, ws = start(compass_redis_url, compass_workers, ["m0@metrics"], timeout_s=3.0,
                    extra_args=["--compass-metrics-port", str(port)])
    assert app.tasks["j.heavy"].delay(1).get(timeout=20) == 1
    text = wait_until(lambda: _scrape(port), 10, "the metrics endpoint")
    # the preload loaded both models on this worker: counted, with the load in seconds
    assert 'compass_model_loads_total{model="big",worker="m0@metrics"} 1.0' in text, \
        text[-3000:] + worker_logs(ws)
    assert "compass_model_load_seconds_bucket" in text
    assert "compass_model_load_ms" not in text  # base units only
    assert "serves Prometheus metrics on port" in ws[0].log()
