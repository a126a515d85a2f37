"""Monitoring: signal metrics, the state collector, the decision log, Flower's hooks.

prometheus_client and flower are in the ``test`` extra: a missing one fails here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from compass_celery import monitoring, signals
from compass_celery.placement import Decision
from compass_celery.planner.admission import Slo, Verdict, judge
from compass_celery.planner.types import ModelDemand, WorkerView
from compass_celery.state.connection import StateUnavailable
from compass_celery.state.store import MemoryStateStore

ROOT = Path(__file__).resolve().parents[2]
DECISION = Decision(task="t.caption", model="captioner", worker="gpu0", queue="compass.w.gpu0",
                    policy="compass", charge_ms=120.0, est_finish_ms=180.0, wait_ms=60.0,
                    run_ms=120.0, reason="captioner resident")


@pytest.fixture
def metrics() -> Any:
    m = monitoring.install_metrics(CollectorRegistry())
    yield m
    m.disconnect()


def value(m: Any, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_signals_move_counters_and_histograms(metrics: Any) -> None:
    signals.task_placed.send(sender=None, decision=DECISION)
    signals.task_placed.send(sender=None, decision=Decision(
        task="t", model=None, worker="*", queue="compass.shared", policy="compass",
        charge_ms=0.0, reason="no live compass worker known", fallback=True))
    signals.task_reassigned.send(sender=None, job_id="j", node="n", old="gpu0", new="gpu1")
    signals.model_loaded.send(sender="gpu0", model="captioner", size_mb=950.0,
                              declared_mb=950.0, ms=640.0)
    signals.model_evicted.send(sender="gpu0", model="ocr")
    placed = "compass_tasks_placed_total"
    assert value(metrics, placed, policy="compass", worker="gpu0", fallback="false") == 1
    assert value(metrics, placed, policy="compass", worker="*", fallback="true") == 1
    assert value(metrics, "compass_tasks_reassigned_total") == 1
    assert value(metrics, "compass_model_loads_total", worker="gpu0", model="captioner") == 1
    assert value(metrics, "compass_model_evictions_total", worker="gpu0", model="ocr") == 1
    # fallbacks carry no estimate, so only the real placement is observed
    assert value(metrics, "compass_placement_estimated_finish_seconds_count") == 1
    assert value(metrics, "compass_placement_estimated_finish_seconds_sum") == 0.18
    assert value(metrics, "compass_model_load_seconds_bucket", le="1.0") == 1  # 640 ms
    assert value(metrics, "compass_model_load_seconds_bucket", le="0.5") == 0


def test_deadline_signals_count_per_slo_class(metrics: Any) -> None:
    interactive = Slo("interactive", 400.0)
    send = signals.admission_decided.send
    send(sender=None, what="job 'j'", slo=interactive, verdict=Verdict(True, predicted_ms=90.0))
    send(sender=None, what="job 'j'", slo=Slo("", 50.0, on_miss="late"),  # a bare deadline
         verdict=Verdict(True, late=True, predicted_ms=90.0, deadline_ms=50.0, miss_ms=40.0))
    send(sender=None, what="job 'j'", slo=interactive, verdict=Verdict(
        False, predicted_ms=900.0, deadline_ms=400.0, miss_ms=500.0,
        reason="predicted to finish in 900 ms, 500 ms past its 400 ms deadline",
        kind="deadline"))
    send(sender=None, what="task 't'", slo=None, verdict=Verdict(
        False, reason="queue full: 9000 ms of work ahead, over the bound of 5000 ms",
        kind="queue_full"))
    send(sender=None, what="job 'j'", slo=interactive, verdict=judge(  # on time but its load
        interactive, 700.0, 300.0, load_ms=500.0))
    signals.task_shed.send(sender=None, job_id="j", node="b", task_id="x", slo="interactive")
    signals.job_deadline_outcome.send(sender=None, job_id="j", slo="interactive", met=True,
                                      late_ms=-20.0)
    signals.job_deadline_outcome.send(sender=None, job_id="k", slo="", met=False,
                                      late_ms=35.0)
    assert value(metrics, "compass_admission_admitted_total", slo="interactive") == 1
    assert value(metrics, "compass_admission_admitted_total", slo="none") == 1
    assert value(metrics, "compass_admission_late_total", slo="none") == 1
    assert value(metrics, "compass_admission_late_total", slo="interactive") == 0
    assert value(metrics, "compass_admission_rejected_total", slo="interactive",
                 reason="deadline") == 1
    assert value(metrics, "compass_admission_rejected_total", slo="none",
                 reason="queue_full") == 1
    assert value(metrics, "compass_admission_rejected_total", slo="interactive",
                 reason="cold") == 1
    assert value(metrics, "compass_tasks_shed_total", slo="interactive") == 1
    assert value(metrics, "compass_deadline_jobs_total", slo="interactive", outcome="met") == 1
    assert value(metrics, "compass_deadline_jobs_total", slo="none", outcome="missed") == 1


def test_install_is_idempotent_and_disconnect_stops_counting() -> None:
    reg = CollectorRegistry()
    m = monitoring.install_metrics(reg)
    assert monitoring.install_metrics(reg) is m  # no duplicate-timeseries error
    m.disconnect()
    signals.task_placed.send(sender=None, decision=DECISION)
    assert value(m, "compass_tasks_placed_total", policy="compass", worker="gpu0",
                 fallback="false") == 0


def test_a_bad_signal_payload_does_not_reach_the_sender(metrics: Any) -> None:
    signals.model_loaded.send(sender="gpu0", model="m", ms="not a number")  # logged by celery
    assert value(metrics, "compass_model_loads_total", worker="gpu0", model="m") == 1


def _view(name: str, now: float, **kw: Any) -> WorkerView:
    fields = dict(name=name, queue=f"compass.w.{name}", gpu_total_mb=16000.0,
                  gpu_free_mb=15050.0, resident=frozenset({"captioner"}), heartbeat=now - 1.0,
                  device="emulated")
    fields.update(kw)
    return WorkerView(**fields)


def test_state_collector_exports_live_workers() -> None:
    now = time.time()
    store = MemoryStateStore()
    store.publish(_view("gpu0", now, hop_ms=4.0))
    store.publish(_view("old", now, heartbeat=now - 60))  # dead: skipped, not exported
    store.charge("gpu0", 250.0)
    store.add_pending("gpu0", 40.0)
    reg = CollectorRegistry()
    reg.register(monitoring.CompassStateCollector(store, 5.0, clock=lambda: now))
    get = reg.get_sample_value
    assert get("compass_state_up") == 1
    assert get("compass_workers_live") == 1
    assert get("compass_worker_records_skipped") == 1
    assert get("compass_worker_backlog_seconds", {"worker": "gpu0"}) == 0.25
    assert get("compass_worker_pending_seconds", {"worker": "gpu0"}) == 0.04
    assert get("compass_worker_hop_seconds", {"worker": "gpu0"}) == 0.004
    assert get("compass_worker_gpu_free_bytes", {"worker": "gpu0"}) == 15050.0 * 10**6
    assert get("compass_worker_gpu_total_bytes", {"worker": "gpu0"}) == 16000.0 * 10**6
    assert get("compass_worker_resident_models", {"worker": "gpu0"}) == 1
    assert get("compass_worker_heartbeat_age_seconds", {"worker": "gpu0"}) == pytest.approx(1.0)
    assert get("compass_worker_info", {"worker": "gpu0", "queue": "compass.w.gpu0",
                                       "device": "emulated"}) == 1
    assert get("compass_worker_backlog_seconds", {"worker": "old"}) is None


def test_state_collector_exports_the_workers_needed() -> None:
    """Two workers served 1.5 s of captioner work per second: with the default classes
    (a 400 ms interactive deadline) and 100 ms tasks, each is planned 75% busy, so
    1.5 / 0.75 = 2 workers; an idle cluster needs none."""
    now = time.time()
    store = MemoryStateStore()
    served = {"captioner": ModelDemand(750.0, 7.5)}
    store.publish(_view("gpu0", now, served=served))
    store.publish(_view("gpu1", now, served=served))  # both hold it: no load to add
    reg = CollectorRegistry()
    reg.register(monitoring.CompassStateCollector(store, 5.0, clock=lambda: now,
                                                  model_sizes_mb={"captioner": 950.0}))
    get = reg.get_sample_value
    assert get("compass_demand_busy_workers") == pytest.approx(1.5)
    assert get("compass_capacity_target_utilization") == pytest.approx(0.75)
    assert get("compass_workers_needed") == 2

    idle = MemoryStateStore()
    idle.publish(_view("gpu0", now))
    reg = CollectorRegistry()
    reg.register(monitoring.CompassStateCollector(idle, 5.0, clock=lambda: now,
                                                  slo_classes={"tight": {"deadline_ms": 50}}))
    assert reg.get_sample_value("compass_workers_needed") == 0
    assert reg.get_sample_value("compass_state_up") == 1


def test_state_collector_reports_down_instead_of_failing_the_scrape() -> None:
    class Down(MemoryStateStore):
        def snapshot(self, now: float, heartbeat_timeout_s: float) -> Any:
            raise StateUnavailable("Redis at redis://x unavailable")

    reg = CollectorRegistry()
    reg.register(monitoring.CompassStateCollector(Down(), 5.0))
    assert reg.get_sample_value("compass_state_up") == 0


def test_flowerconfig_sets_flower_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from flower.options import options
    from prometheus_client import REGISTRY

    monkeypatch.setenv("COMPASS_REDIS_URL", "redis://127.0.0.1:1/0")  # never contacted
    monkeypatch.setattr(monitoring, "_REGISTERED", set())
    before = set(REGISTRY._collector_to_names)
    try:
        options.parse_config_file(str(ROOT / "compose" / "flowerconfig.py"), final=False)
        assert options.format_task is None  # placement rides on kwargsrepr: no formatter
        assert "kwargs" in options.tasks_columns
        added = set(REGISTRY._collector_to_names) - before
        assert [type(c) for c in added] == [monitoring.CompassStateCollector]
    finally:
        for c in set(REGISTRY._collector_to_names) - before:
            REGISTRY.unregister(c)


def test_compose_file_parses_and_keeps_redis_durable() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"redis", "gpu0", "emulated", "flower"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    gpu = services["gpu0"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0"]
    assert "--compass-gpu" in " ".join(gpu["command"])
    assert "flowerconfig.py" in " ".join(services["flower"]["command"])
    assert (ROOT / "compose" / "Dockerfile").read_text().count("FROM") == 1


def test_flowerconfig_takes_the_apps_compass_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as ``celery -A proj flower --conf=...``: the app's state Redis, key prefix and
    heartbeat timeout, not the defaults."""
    from celery import Celery
    from flower.options import options
    from prometheus_client import REGISTRY

    from compass_celery import Compass

    for name in ("COMPASS_REDIS_URL", "CELERY_BROKER_URL", "COMPASS_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    app = Celery("flowerapp", broker="memory://")  # the current app, as -A makes it
    app.conf.update(compass_redis_url="redis://127.0.0.1:2/3", compass_key_prefix="fl",
                    compass_heartbeat_timeout_s=2.5)
    Compass(app)
    monkeypatch.setattr(monitoring, "_REGISTERED", set())
    before = set(REGISTRY._collector_to_names)
    try:
        options.parse_config_file(str(ROOT / "compose" / "flowerconfig.py"), final=False)
        (collector,) = set(REGISTRY._collector_to_names) - before
        assert collector.store.url == "redis://127.0.0.1:2/3"
        assert collector.store.prefix == "fl" and collector.timeout_s == 2.5
    finally:
        for c in set(REGISTRY._collector_to_names) - before:
            REGISTRY.unregister(c)
