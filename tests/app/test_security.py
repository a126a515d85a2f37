"""Redis AUTH and ACL users for broker and state; the celery subcommand; output limits."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import redis

from compass_celery.jobs import JobFailed
from compass_celery.jobs.dag import Dag
from compass_celery.local import RedisServer, free_port, wait_until
from compass_celery.testing import worker_logs
from tests.support.jobapp import make_app

pytestmark = pytest.mark.redis
GPU = ["--compass-emulate-gpu-mb", "4000", "--compass-preload", "small"]


def one_worker_round_trip(compass_workers, url: str, name: str, env: dict | None = None,
                          how: str = "") -> object:
    """Start one worker on ``url``, wait for its record, place and run a task on it."""
    w = compass_workers("tests.support.jobapp", name, *GPU,
                        env={"COMPASS_BROKER_URL": url, **(env or {})})
    app = make_app(url, compass_snapshot_ttl_s=0.0)
    try:
        wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1,
                   30, f"the worker to publish {how}")
    except TimeoutError:
        raise AssertionError(worker_logs([w])) from None
    res = app.tasks["j.add"].delay(2, 3)
    assert res.get(timeout=20) == 5
    assert app.compass.placement(res.id).worker == name
    return app


def test_acl_user_and_password_work_for_broker_and_state(compass_redis_server,
                                                         compass_workers):
    acl = ["--requirepass", "admin-secret", "--user", "compass", "on", ">s3cret", "~*", "&*",
           "+@all"]
    with RedisServer(args=acl) as server:
        url = f"redis://compass:s3cret@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(f"redis://compass:wrong@127.0.0.1:{server.port}/0").ping()
        app = one_worker_round_trip(compass_workers, url, "acl@sec", how="through an ACL user")
        assert app.compass.redis_url == url  # state defaults to the (authenticated) broker


def test_celery_compass_subcommand(compass_redis_url, compass_workers):
    w = compass_workers("tests.support.jobapp", "cli@sec", *GPU,
                        env={"COMPASS_BROKER_URL": compass_redis_url})
    app = make_app(compass_redis_url)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1, 30,
               "a worker")
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.jobapp", "compass", "status",
         "--settings"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COMPASS_BROKER_URL": compass_redis_url})
    assert out.returncode == 0, out.stderr + worker_logs([w])
    assert "1 live compass worker(s)" in out.stdout
    assert "cli@sec" in out.stdout and "small" in out.stdout
    assert "compass_heartbeat_timeout_s" in out.stdout


def test_output_over_the_limit_fails_the_job_by_name(compass_redis_url, compass_workers):
    env = {"COMPASS_BROKER_URL": compass_redis_url, "COMPASS_JOBAPP_MAX_OUTPUT_KB": "64"}
    w = compass_workers("tests.support.jobapp", "big@sec", *GPU, env=env)
    app = make_app(compass_redis_url)
    wait_until(lambda: len(app.compass.store.snapshot(time.time(), 3.0).workers) == 1, 30,
               "a worker")
    dag = Dag(app, "bigout")
    a = dag.node("a", app.tasks["j.src"].s(1))
    b = dag.node("b", app.tasks["j.big"].s(200), after=[a])
    dag.node("c", app.tasks["j.add"].s(1), after=[b])
    with pytest.raises(JobFailed, match="node 'b'.*over compass_max_output_kb=64"):
        dag.apply_async().get(timeout=20)
    wait_until(lambda: "over compass_max_output_kb" in w.log(), 10, "the failure in the log")


def test_tls_rediss_urls_work_for_broker_and_state(tmp_path, compass_workers):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1"], capture_output=True)
    assert made.returncode == 0, made.stderr
    server = RedisServer(args=["--port", "0", "--tls-port", "{port}", "--tls-cert-file",
                               str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
                               str(cert), "--tls-auth-clients", "no"])
    server.args = [a.replace("{port}", str(server.port)) for a in server.args]
    url = (f"rediss://127.0.0.1:{server.port}/0?ssl_cert_reqs=required"
           f"&ssl_ca_certs={cert}")
    server.proc = subprocess.Popen(
        [server.binary, "--save", "", "--appendonly", "no", "--dir", server.dir, *server.args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _tls_ping(url), 10, "redis-server with TLS")
        app = one_worker_round_trip(compass_workers, url, "tls@sec", how="over TLS")
        assert app.compass.redis_url.startswith("rediss://")
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def _tls_ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def test_sentinel_urls_work_for_broker_and_state(tmp_path, compass_workers, monkeypatch):
    with RedisServer() as master:
        port = free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n")
        sentinel = subprocess.Popen([master.binary, str(conf), "--sentinel"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            probe = redis.Redis(port=port, socket_connect_timeout=0.5)
            wait_until(lambda: _sentinel_knows(probe), 10, "sentinel to see the master")
            url = f"sentinel://127.0.0.1:{port}"
            monkeypatch.setenv("COMPASS_JOBAPP_SENTINEL_MASTER", "mymaster")
            one_worker_round_trip(compass_workers, url, "sen@sec", how="through Sentinel",
                                  env={"COMPASS_JOBAPP_SENTINEL_MASTER": "mymaster"})
            # the state really lives on the master that Sentinel named
            assert redis.Redis(port=master.port).hexists("{compass}:workers", "sen@sec")
        finally:
            sentinel.terminate()
            sentinel.wait(5)


def _sentinel_knows(probe: redis.Redis) -> bool:
    try:
        return probe.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster") \
            is not None
    except redis.RedisError:
        return False


def test_sentinel_with_acl_user_and_sentinel_password(tmp_path):
    """The state URL's ACL username reaches the master, and sentinel_kwargs the sentinel."""
    from compass_celery.state.connection import connect

    with RedisServer(args=["--user", "default", "off", "--user", "alice", "on", ">apw",
                           "~*", "&*", "+@all"]) as master:
        port = free_port()
        conf = tmp_path / "sentinel.conf"
        conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass spw\n"
                        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\n"
                        "sentinel auth-user mymaster alice\nsentinel auth-pass mymaster apw\n")
        sentinel = subprocess.Popen([master.binary, str(conf), "--sentinel"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            probe = redis.Redis(port=port, password="spw", socket_connect_timeout=0.5)
            wait_until(lambda: _sentinel_knows(probe), 10, "sentinel to see the master")
            client = connect(f"sentinel://alice:apw@127.0.0.1:{port}", master_name="mymaster",
                             sentinel_kwargs={"password": "spw"})
            client.set("k", "v")
            assert redis.Redis(port=master.port, username="alice",
                               password="apw").get("k") == b"v"
            with pytest.raises(redis.RedisError):  # no sentinel password: refused
                connect(f"sentinel://alice:apw@127.0.0.1:{port}",
                        master_name="mymaster").ping()
        finally:
            sentinel.terminate()
            sentinel.wait(5)
