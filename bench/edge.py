"""Resolve's three answer stages, measured from outside with wrk: what each one saves over the route alone.

A fleet's resolve can be answered at three depths (docs/architecture.md, "Upload → build → resolve"):

  304       GET with the current ETag in If-None-Match: the server's protocol (server/serve.py) answers it
            before any ASGI work;
  fleet     GET from a cached token: the ``FleetPath`` middleware (api/http/fastpath.py) answers from the answer
            cache before routing;
  route     POST of the same question: FastAPI's routing, dependencies and validation, then the same cache.

It fills a PostgreSQL catalog (bench/catalogfill.py), serves it with ``enginefarm api`` (one process), and runs
wrk (bench/tail.py's: two threads, keep-alive connections) against GET /healthz (the floor) and each depth; then
the same against a bare ``uvicorn api.main:app`` (httptools), where the 304 is the app's. It prints requests/s,
p50/p99 and the API's CPU per request, and the ratios: route/304 and route/fleet (CPU per request) are what
answering every resolve the simplest way, through the route, would cost; app/protocol what the protocol's 304
saves.

    python bench/edge.py                 # 10 s per phase, 16 connections
    python bench/edge.py --smoke         # 1 s per phase: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import catalogfill  # noqa: E402
from bench.fleet import MACHINES  # noqa: E402
from bench.procstat import cpu_of  # noqa: E402
from bench.tail import parse, wrk  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from server.embedded import free_port, issue_token, wait_http  # noqa: E402

REDIS_DB = int(os.environ.get("ENGINEFARM_EDGE_REDIS_DB", "14"))


def run_wrk(url: str, headers: dict[str, str], seconds: float, connections: int, script: Path | None = None) -> dict:
    """One wrk run (bench/tail.py's, its output read there too), with its request count."""
    out = wrk(url, seconds, connections, script, headers).communicate(timeout=seconds + 60)[0]
    return parse(out) | {"requests": int(re.search(r"(\d+) requests in", out).group(1))}


def serve(cmd: list[str], env: dict[str, str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=ROOT
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", 120, proc)
    return proc


def phases(port: int, token: str, question: dict[str, str], args, work: Path) -> dict[str, dict]:
    """wrk against the floor and each depth of the server on ``port``, with the API's CPU per request."""
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    get_url = f"{base}/v1/resolve?{urlencode(question)}"
    first = httpx.get(get_url, headers=auth, timeout=30)
    assert first.status_code == 200, first.text[:300]
    etag = first.headers["etag"]
    assert httpx.get(get_url, headers=auth | {"If-None-Match": etag}, timeout=30).status_code == 304
    body = {"model": question["model"], "machine": {"platform": question["platform"]}}
    post = httpx.post(f"{base}/v1/resolve", headers=auth, json=body, timeout=30)
    assert post.status_code == 200, post.text[:300]
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(body))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    runs = {
        "healthz": (f"{base}/healthz", {}, None),
        "304": (get_url, auth | {"If-None-Match": etag}, None),
        "fleet": (get_url, auth, None),
        "route": (f"{base}/v1/resolve", auth, script),
    }
    out = {}
    for name, (url, headers, lua) in runs.items():
        if not args.smoke:
            run_wrk(url, headers, 1.0, args.connections, lua)  # warm
        cpu0 = cpu_of(lambda p: p.pgrp == args.api_pgrp)
        r = run_wrk(url, headers, args.seconds, args.connections, lua)
        r["cpu_ms"] = (cpu_of(lambda p: p.pgrp == args.api_pgrp) - cpu0) * 1000 / max(r["requests"], 1)
        assert r["non2xx"] == 0 and not r["socket_errors"], (name, r)
        out[name] = r
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--smoke", action="store_true", help="1 s per phase: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.connections = 1.0, 4
    if shutil.which("wrk") is None:  # Debian's package
        subprocess.run(["bash", str(ROOT / "deploy" / "wrk.sh")], check=True)
    with ExitStack() as stack:
        work, pg_url, env = stack.enter_context(catalogfill.scratch_catalog("enginefarm_edge", REDIS_DB))
        penv = {k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | env
        catalogfill.fill(pg_url, 20, 25)
        token = issue_token(
            Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()}), "edge", ["read"]
        )
        question = {"model": catalogfill.model_name(1), **MACHINES["CPU server"]}
        servers = {
            "enginefarm api": [sys.executable, "-m", "enginefarm", "api", "--port", "PORT", "--log-level", "warning"],
            "bare uvicorn": [
                sys.executable,
                "-m",
                "uvicorn",
                "api.main:app",
                "--http",
                "httptools",
                "--port",
                "PORT",
                "--log-level",
                "warning",
            ],
        }
        results = {}
        for label, cmd in servers.items():
            port = free_port()
            proc = serve([c.replace("PORT", str(port)) for c in cmd], penv, port)
            try:
                args.api_pgrp = proc.pid
                results[label] = phases(port, token, question, args, work)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            time.sleep(0.5)
    print(f"wrk -t2 -c{args.connections}, {args.seconds:g} s a phase; one API process")
    print(f"{'server':16} {'phase':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>11}")
    for label, by in results.items():
        for name, r in by.items():
            print(f"{label:16} {name:8} {r['rps']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['cpu_ms']:11.3f}")
    farm, bare = results["enginefarm api"], results["bare uvicorn"]
    ratios = {
        "route/304 CPU per request": farm["route"]["cpu_ms"] / farm["304"]["cpu_ms"],
        "route/fleet CPU per request": farm["route"]["cpu_ms"] / farm["fleet"]["cpu_ms"],
        "304 CPU per request, app (bare uvicorn)/protocol": bare["304"]["cpu_ms"] / farm["304"]["cpu_ms"],
        "304 req/s, protocol/app (bare uvicorn)": farm["304"]["rps"] / bare["304"]["rps"],
        "route req/s, enginefarm api/bare uvicorn": farm["route"]["rps"] / bare["route"]["rps"],
    }
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
