"""Start the MiniLM web app as its README says and load it: a private ``redis-server``,
two CPU workers (``celery -A minilm_tasks worker ... --compass-gpu cpu --compass-preload minilm``),
``flask --app minilm_web run``, then 200 requests to ``/embed`` and 200 to ``/search`` at 50
requests/s, each sent on time whatever the answers before it (open loop). Prints how many
were answered within the 400 ms SLO (HTTP 200), refused (429), late (504) or failed, with
p50 and p99 of all answers' latency, and the load average. Run from the repository root::

    python examples/flask_minilm/loadgen.py [--requests 200] [--rate 50] [--out FILE]

Needs ``pip install -e '.[examples,real]'`` and ``redis-server`` on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from compass_celery.local import RedisServer, free_port, wait_until

HERE = Path(__file__).resolve().parent
SLO_S = 0.4
BODIES = {"/embed": lambda i: {"text": f"request {i}: when is the budget meeting"},
          "/search": lambda i: {"query": f"request {i}: when is the budget meeting"}}


def post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, float]:
    """POST ``body`` as JSON: (HTTP status, 0 for no answer; seconds to the answer)."""
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            res.read()
            code = res.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except OSError:
        code = 0
    return code, time.perf_counter() - t0


def start(redis_url: str, port: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """The two workers and the web app, as the README starts them, logging to ``logs``."""
    env = {**os.environ, "REDIS_URL": redis_url}
    cmds = {f"cpu{i}": ["celery", "-A", "minilm_tasks", "worker", "-P", "solo", "-n",
                        f"cpu{i}@%h", "--compass-gpu", "cpu", "--compass-preload", "minilm"]
            for i in range(2)}
    cmds["web"] = ["flask", "--app", "minilm_web", "run", "--port", str(port)]
    procs = []
    for name, cmd in cmds.items():
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen([str(Path(sys.executable).parent / cmd[0]),
                                           *cmd[1:]], cwd=HERE, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def ready(redis_url: str) -> bool:
    """Whether two workers are live with MiniLM resident (``celery compass status``)."""
    out = subprocess.run([str(Path(sys.executable).parent / "celery"), "-A", "minilm_tasks",
                          "compass", "status", "--json"], cwd=HERE, capture_output=True,
                         env={**os.environ, "REDIS_URL": redis_url}, text=True).stdout
    try:
        workers = json.loads(out)["workers"]
    except (ValueError, KeyError):
        return False
    return sum("minilm" in w["resident"] for w in workers) >= 2


def drive(url: str, n: int, rate: float, body: Any) -> list[tuple[int, float]]:
    """``n`` POSTs to ``url``, the i-th sent at ``i / rate`` s (open loop), each in its own
    thread; their (status, seconds)."""
    out: list[tuple[int, float]] = [(0, 0.0)] * n
    threads = []

    def one(i: int) -> None:
        out[i] = post(url, body(i))

    t0 = time.perf_counter()
    for i in range(n):
        time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()
    return out


def cpu_s(procs: list[subprocess.Popen[bytes]]) -> list[float]:
    """Each process's CPU seconds so far (user and system, from /proc; 0 where unreadable)."""
    out = []
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            out.append(0.0)
    return out


def row(path: str, got: list[tuple[int, float]], cpu: list[float]) -> str:
    """One table row: within SLO, late 200s, 429, 504, other; p50 and p99 in ms."""
    ok = sum(c == 200 and s <= SLO_S for c, s in got)
    late = sum(c == 200 and s > SLO_S for c, s in got)
    other = sum(c not in (200, 429, 504) for c, _ in got)
    ms = sorted(s * 1000 for _, s in got)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return (f"{path:<8} {ok:>4}/{len(got):<4} {late:>9} {sum(c == 429 for c, _ in got):>5}"
            f" {sum(c == 504 for c, _ in got):>5} {other:>6} {statistics.median(ms):>7.0f}"
            f" {p99:>7.0f}  " + " ".join(f"{c * 1000 / len(got):>5.1f}" for c in cpu))


HEADER = ("endpoint  within 400 ms  late 200  429   504   other  p50 ms  p99 ms  "
          "CPU ms a request: cpu0 cpu1 web")


Outcomes = dict[str, tuple[list[tuple[int, float]], list[float]]]


def run(n: int, rate: float, logs: Path) -> Outcomes:
    """Start everything, warm up, drive each endpoint: per endpoint, each request's
    (status, seconds) and each process's CPU seconds over them (cpu0, cpu1, web)."""
    port = free_port()
    with RedisServer() as redis:
        procs = start(redis.url, port, logs)
        try:
            wait_until(lambda: ready(redis.url), 180, "two workers with MiniLM resident")
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: post(base + "/embed", BODIES["/embed"](0))[0] == 200, 60,
                       "the web app")
            for path, body in BODIES.items():  # warm up: the documents, the tokenizer
                for i in range(10):
                    post(base + path, body(i))
            time.sleep(1.0)
            out: Outcomes = {}
            for path, body in BODIES.items():
                before = cpu_s(procs)
                got = drive(base + path, n, rate, body)
                out[path] = got, [b - a for a, b in zip(before, cpu_s(procs), strict=True)]
                time.sleep(2.0)
            return out
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(15)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run, print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per endpoint")
    parser.add_argument("--rate", type=float, default=50.0, help="requests a second")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="flask-minilm-"))
    before = os.getloadavg()[0]
    try:
        outcomes = run(args.requests, args.rate, logs)
    except BaseException:
        print(f"failed; the processes' logs are in {logs}", file=sys.stderr)
        raise
    lines = [HEADER, *(row(path, *got) for path, got in outcomes.items())]
    lines.append(f"load average (1 min) {before:.1f} before, {os.getloadavg()[0]:.1f} after;"
                 f" {os.cpu_count()} cores; logs in {logs}")
    print("\n".join(lines))
    if args.out:
        cmd = "python examples/flask_minilm/loadgen.py " + " ".join(argv or sys.argv[1:])
        Path(args.out).write_text(f"# {cmd.strip()}\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
