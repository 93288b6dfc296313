"""Keep-alive latency of the API under several worker processes: Nagle's algorithm against TCP_NODELAY.

With ``uvicorn --workers N`` > 1, each keep-alive answer waited about 40 ms for Nagle's algorithm. ``enginefarm
api`` listens on a socket with TCP_NODELAY (enginefarm/server/serve.py). This starts, one after the other,

  baseline   uvicorn enginefarm.api.main:app --workers 2
  ours       enginefarm api --workers 2
  one        uvicorn enginefarm.api.main:app (one worker, where Nagle never bit)

on an embedded catalog, sends N sequential keep-alive GET /healthz to each, and prints p50/p95 and the ratio
ours/baseline.

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

from enginefarm.server.embedded import free_port  # noqa: E402


def measure(cmd: list[str], env: dict[str, str], requests: int) -> tuple[float, float]:
    """p50 and p95 (ms) of ``requests`` keep-alive GET /healthz to the server ``cmd`` starts (PORT: its port)."""
    port = free_port()
    proc = subprocess.Popen([c.replace("PORT", str(port)) for c in cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
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
            for _ in range(requests):
                started = time.perf_counter()
                client.get(url).raise_for_status()
                times.append((time.perf_counter() - started) * 1000)
        times.sort()
        return statistics.median(times), times[int(0.95 * (len(times) - 1))]
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
            "ENGINEFARM_DATA_DIR": data, "ENGINEFARM_RECONCILE_SECONDS": "0", "PYTHONPATH": str(ROOT)}
        subprocess.run([py, "-m", "enginefarm", "migrate"], env=env, check=True, capture_output=True)
        uvicorn = [py, "-m", "uvicorn", "enginefarm.api.main:app", "--port", "PORT", "--log-level", "warning"]
        baseline = measure([*uvicorn, "--workers", "2"], env, requests)
        ours = measure([py, "-m", "enginefarm", "api", "--port", "PORT", "--workers", "2"], env, requests)
        one = measure(uvicorn, env, requests)
    print(f"keep-alive GET /healthz, {requests} sequential requests each (p50 / p95 ms):")
    print(f"  baseline uvicorn --workers 2:             {baseline[0]:6.1f} / {baseline[1]:6.1f}")
    print(f"  enginefarm api --workers 2 (TCP_NODELAY): {ours[0]:6.1f} / {ours[1]:6.1f}")
    print(f"  uvicorn, one worker:                      {one[0]:6.1f} / {one[1]:6.1f}")
    print(f"ratio ours/baseline p50: {ours[0] / baseline[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
