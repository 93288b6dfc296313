"""Keep-alive latency and CPU per request of the API: Nagle's algorithm against TCP_NODELAY, h11 against httptools.

With ``uvicorn --workers N`` > 1, each keep-alive answer waited about 40 ms for Nagle's algorithm. ``enginefarm
api`` listens on a socket with TCP_NODELAY (server/serve.py). This starts, one after the other,

  baseline   uvicorn api.main:app --workers 2
  ours       enginefarm api --workers 2
  one        uvicorn api.main:app (one worker, where Nagle never bit)
  h11        uvicorn api.main:app --http h11 --loop asyncio (one worker: pure-Python HTTP parsing)

on an embedded catalog, sends N sequential keep-alive GET /healthz to each, and prints p50/p95, the server's CPU
per request, and the ratios ours/baseline (p50) and one/h11 (CPU per request: httptools and uvloop, which
``enginefarm[server]`` installs and uvicorn picks by itself, against uvicorn's pure-Python fallback).

    python bench/serve.py            # 200 requests each
    python bench/serve.py --smoke    # 20 requests each: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.procstat import cpu_of  # noqa: E402
from server.embedded import free_port  # noqa: E402


def measure(cmd: list[str], env: dict[str, str], requests: int) -> tuple[float, float, float]:
    """p50 and p95 (ms) of ``requests`` keep-alive GET /healthz to the server ``cmd`` starts (PORT: its port), and
    the server's CPU ms per request."""
    port = free_port()
    proc = subprocess.Popen(
        [c.replace("PORT", str(port)) for c in cmd],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        answered, deadline = 0, time.monotonic() + 120
        while answered < 20:  # every worker process up, not only the first
            assert proc.poll() is None and time.monotonic() < deadline, f"{cmd} did not start"
            try:
                httpx.get(url, timeout=2)
                answered += 1
            except httpx.HTTPError:
                time.sleep(0.1)
        with httpx.Client(timeout=10) as client:
            for _ in range(10):
                client.get(url)
            times = []
            cpu = cpu_of(lambda p: p.pgrp == proc.pid)
            for _ in range(requests):
                started = time.perf_counter()
                client.get(url).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
            cpu = (cpu_of(lambda p: p.pgrp == proc.pid) - cpu) * 1000 / requests
        times.sort()
        return statistics.median(times), times[int(0.95 * (len(times) - 1))], cpu
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="sequential keep-alive requests per server")
    parser.add_argument("--smoke", action="store_true", help="20 requests each: checks that it runs")
    args = parser.parse_args(argv)
    requests = 20 if args.smoke else args.requests
    py = sys.executable
    with tempfile.TemporaryDirectory() as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | {
            "ENGINEFARM_DATA_DIR": data,
            "ENGINEFARM_RECONCILE_SECONDS": "0",
            "PYTHONPATH": str(ROOT),
        }
        subprocess.run([py, "-m", "enginefarm", "migrate"], env=env, check=True, capture_output=True)
        uvicorn = [py, "-m", "uvicorn", "api.main:app", "--port", "PORT", "--log-level", "warning"]
        baseline = measure([*uvicorn, "--workers", "2"], env, requests)
        ours = measure([py, "-m", "enginefarm", "api", "--port", "PORT", "--workers", "2"], env, requests)
        one = measure(uvicorn, env, requests)
        h11 = measure([*uvicorn, "--http", "h11", "--loop", "asyncio"], env, requests)
    print(f"keep-alive GET /healthz, {requests} sequential requests each (p50 / p95 ms, server CPU ms/request):")
    for label, r in (
        ("baseline uvicorn --workers 2:           ", baseline),
        ("enginefarm api --workers 2 (TCP_NODELAY):", ours),
        ("uvicorn, one worker (httptools, uvloop):  ", one),
        ("uvicorn, one worker, h11 on asyncio:     ", h11),
    ):
        print(f"  {label} {r[0]:6.1f} / {r[1]:6.1f}   {r[2]:5.2f}")
    print(f"ratio ours/baseline p50: {ours[0] / baseline[0]:.3f}")
    if h11[2] > 0:
        print(f"ratio httptools+uvloop / h11+asyncio, CPU per request: {one[2] / h11[2]:.3f}")
    else:  # CPU is read in clock ticks (10 ms): a few requests may not add up to one
        print("ratio httptools+uvloop / h11+asyncio, CPU per request: too little CPU to measure; use more --requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
