"""The compose deployment: no default secrets, graceful stops, an app, a lean build context."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
SECRETS = {"REDIS_PASSWORD": "s3cret", "FLOWER_USER": "ops", "FLOWER_PASSWORD": "pw"}


def test_no_default_password_and_flower_behind_basic_auth() -> None:
    text = COMPOSE.read_text()
    assert "change-me" not in text and "REDIS_PASSWORD:-" not in text
    assert "${REDIS_PASSWORD:?" in text
    flower = yaml.safe_load(text)["services"]["flower"]
    # the credentials come from the environment, never on a command line (ps shows those)
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_USER:?")
    assert not any("basic-auth" in arg or "PASSWORD" in arg for arg in flower["command"])


def test_a_production_web_server_and_torch_only_where_models_run() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert services["app"]["command"][0] == "gunicorn"  # not Flask's development server
    assert "torch" not in compose["x-compass-image"]["build"]["args"]["EXTRAS"]
    assert "torch" in compose["x-gpu-worker"]["build"]["args"]["EXTRAS"]
    for name in ("flower", "emulated", "app", "app-worker"):
        assert "torch" not in str(services[name].get("build", {})), name


def test_prometheus_scrapes_flower_and_every_worker() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    config = yaml.safe_load((ROOT / "compose" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"]
               for sc in job.get("static_configs", []) for t in sc["targets"]}
    names = {n for job in config["scrape_configs"]
             for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
    assert "flower:5555" in targets and {"gpu0:9100", "gpu1:9100"} <= targets
    assert {"emulated", "app-worker"} <= names  # scaled replicas, found by DNS
    assert "prometheus" in services
    assert any("prometheus.yml" in v for v in services["prometheus"]["volumes"])


def test_workers_get_time_to_hand_back_and_an_app_enqueues_jobs() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("gpu0", "gpu1", "emulated", "app-worker"):
        assert services[name]["stop_grace_period"] == "2m", name
    assert any("vision_api" in arg for arg in services["app"]["command"])
    assert services["app-worker"]["command"][:3] == ["celery", "-A", "make_celery"]


def test_the_build_context_leaves_local_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "bench-out"} <= set(ignored)
    assert "COPY examples ./examples" in (ROOT / "compose" / "Dockerfile").read_text()


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="needs docker-compose (Debian package) to validate the file")
def test_docker_compose_validates_it_and_refuses_to_start_without_a_password() -> None:
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    base = ["docker-compose", "-f", str(COMPOSE), "--profile", "gpu", "--profile",
            "emulated", "--profile", "app", "config", "-q"]
    ok = subprocess.run(base, env={**env, **SECRETS}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(base, env=env, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "REDIS_PASSWORD" in refused.stderr
