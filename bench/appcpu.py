"""The API's own CPU per request, in one process and without sockets: a steadier judge than throughput.

On a 2-core machine shared with a load generator, a closed loop's requests a second swing by a third from one run
to the next (docs/performance.md). This calls the real app (``create_app``, its lifespan run, a PostgreSQL catalog
filled as bench/fleet.py fills it) through ASGI from tasks on uvloop, as uvicorn would after parsing a request,
and counts the process's CPU (every thread: the resolve threads' too) per request:

  null          an ASGI app that answers 200 at once: what this driver costs, the floor
  healthz       GET /healthz through the whole app
  fleet         a fleet's resolve GETs, answered from the kept answers
  conditional   the same with If-None-Match: 304s
  cold          each GET a model and kind of machine not asked before: every answer computed

and, in the same run, two comparisons of what the app's code chose against what it replaced:

  hop           a call handed to two threads and awaited, 16 at a time: asyncio's executor against anyio's
                ``to_thread.run_sync`` with a capacity limiter (a cold answer makes one such hop)
  telemetry     the fleet's 304s with FastAPI's OpenTelemetry look on every request (its default) against off
                (``ENGINEFARM_OPENTELEMETRY``, the farm's default)

Phases alternate over ``--rounds``; each prints the median of its rounds and every round's figure.

    python bench/appcpu.py                  # 2,000 models x 100 engines, 3 rounds
    python bench/appcpu.py --smoke          # 50 models x 25 engines: checks that it runs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import anyio.to_thread  # noqa: E402
import uvloop  # noqa: E402

from bench import catalogfill  # noqa: E402
from bench.fleet import MACHINES  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from server import localservers  # noqa: E402
from server.embedded import issue_token  # noqa: E402

Question = tuple[bytes, bytes, list[tuple[bytes, bytes]]]  # path, query string, headers


async def call(app, question: Question) -> tuple[int, dict[bytes, bytes]]:
    """One GET through the app as uvicorn hands it over; its status and response headers."""
    path, query, headers = question
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path.decode(),
        "raw_path": path,
        "root_path": "",
        "query_string": query,
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    out: dict = {}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            out["status"], out["headers"] = message["status"], dict(message.get("headers") or [])

    await app(scope, receive, send)
    return out["status"], out["headers"]


async def null_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def started(app) -> Callable[[], Awaitable[None]]:
    """Run the app's lifespan start-up; returns its shut-down."""
    inbox: asyncio.Queue = asyncio.Queue()
    outbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, inbox.get, outbox.put))
    message = await outbox.get()
    assert message["type"] == "lifespan.startup.complete", message

    async def stop() -> None:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task

    return stop


async def cpu_per_request(app, pick: Callable[[int], Question], want: int, requests: int, tasks: int) -> float:
    """Process CPU microseconds per request over ``requests`` GETs from ``tasks`` tasks; each answer's status
    checked."""
    counter = iter(range(requests))

    async def loop() -> None:
        for k in counter:
            status, _ = await call(app, pick(k))
            assert status == want, (status, pick(k))

    t0 = time.process_time()
    await asyncio.gather(*(loop() for _ in range(tasks)))
    return (time.process_time() - t0) * 1e6 / requests


async def hop_cost(hops: int, tasks: int = 16) -> dict[str, float]:
    """CPU microseconds per hop to two threads and back: asyncio's executor, anyio's to_thread with a limiter."""
    from concurrent.futures import ThreadPoolExecutor

    pool, limiter, loop = ThreadPoolExecutor(2), anyio.CapacityLimiter(2), asyncio.get_running_loop()

    async def executor(n: int) -> None:
        for i in range(n):
            await loop.run_in_executor(pool, abs, i)

    async def anyio_hop(n: int) -> None:
        for i in range(n):
            await anyio.to_thread.run_sync(abs, i, limiter=limiter)

    out = {}
    for name, fn in (("hop executor", executor), ("hop anyio", anyio_hop)):
        t0 = time.process_time()
        await asyncio.gather(*(fn(hops // tasks) for _ in range(tasks)))
        out[name] = (time.process_time() - t0) * 1e6 / (hops // tasks * tasks)
    pool.shutdown()
    return out


def questions(token: str, names: list[str]) -> tuple[list[Question], Callable[[int], Question]]:
    auth = (b"authorization", f"Bearer {token}".encode())
    host = (b"host", b"127.0.0.1:8000")
    fleet = [
        (b"/v1/resolve", urlencode({"model": m, **fp}).encode(), [host, auth])
        for m in random.Random(3).sample(names, min(20, len(names)))
        for fp in MACHINES.values()
    ]
    # Every (model, machine) question once, in a shuffled order, so no cold question is answered from the cache
    # (with fewer of them than cold requests, they come round again)
    pairs = [(m, fp) for m in names for fp in MACHINES.values()]
    random.Random(11).shuffle(pairs)
    asked = iter(range(1 << 62))

    def cold(_k: int) -> Question:
        m, fp = pairs[next(asked) % len(pairs)]
        return (b"/v1/resolve", urlencode({"model": m, **fp}).encode(), [host, auth])

    return fleet, cold


async def measure(args, settings: Settings, token: str, names: list[str]) -> dict[str, list[float]]:
    from api.app import create_app

    app = create_app(settings)
    traced = create_app(settings.model_copy(update={"opentelemetry": True}))
    stops = [await started(app), await started(traced)]
    try:
        fleet, cold = questions(token, names)
        conditional = []
        for q in fleet:  # every kind of machine gets an answer; its ETag for the 304s
            status, headers = await call(app, q)
            assert status == 200, (status, q)
            await call(traced, q)
            conditional.append((q[0], q[1], [*q[2], (b"if-none-match", headers[b"etag"])]))
        healthz: Question = (b"/healthz", b"", [(b"host", b"127.0.0.1:8000")])
        phases: list[tuple[str, object, Callable[[int], Question], int, int]] = [
            ("null", null_app, lambda k: healthz, 200, args.requests),
            ("healthz", app, lambda k: healthz, 200, args.requests),
            ("fleet", app, lambda k: fleet[k % len(fleet)], 200, args.requests),
            ("conditional", app, lambda k: conditional[k % len(conditional)], 304, args.requests),
            ("conditional, telemetry on", traced, lambda k: conditional[k % len(conditional)], 304, args.requests),
            ("cold", app, cold, 200, args.cold_requests),
        ]
        for _name, target, pick, want, _n in phases:  # warm
            await cpu_per_request(target, pick, want, min(200, args.requests), args.tasks)
        rounds: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, target, pick, want, n in phases:
                rounds.setdefault(name, []).append(await cpu_per_request(target, pick, want, n, args.tasks))
            for name, us in (await hop_cost(args.requests)).items():
                rounds.setdefault(name, []).append(us)
        return rounds
    finally:
        for stop in stops:
            await stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--engines", type=int, default=100, help="engines per model")
    parser.add_argument("--requests", type=int, default=20000, help="requests per round of the fast phases")
    parser.add_argument("--cold-requests", type=int, default=3000, help="requests per round of the cold phase")
    parser.add_argument("--tasks", type=int, default=16, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="50 models x 25 engines, few requests, one round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.engines, args.requests, args.cold_requests, args.rounds = 50, 25, 400, 100, 1
    if not localservers.port_open(5432):
        subprocess.run(["bash", str(ROOT / "deploy" / "services.sh")], check=True)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="appcpu-")))
        pg_url = stack.enter_context(localservers.scratch_postgres("enginefarm_appcpu"))
        env = {
            "ENGINEFARM_DATA_DIR": str(work / "data"),
            "ENGINEFARM_DATABASE_URL": pg_url,
            "ENGINEFARM_RECONCILE_SECONDS": "0",
            "ENGINEFARM_GC_INTERVAL_SECONDS": "0",
        }
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        migrate = [sys.executable, "-m", "enginefarm", "migrate"]
        subprocess.run(migrate, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
        filled = catalogfill.fill(pg_url, args.models, args.engines)
        token = issue_token(settings, "appcpu", ["read"])
        names = [catalogfill.model_name(i) for i in range(1, args.models + 1)]
        rounds = uvloop.run(measure(args, settings, token, names))
    med = {name: statistics.median(us) for name, us in rounds.items()}
    print(f"{filled['engines']} engines, {args.tasks} requests in flight, {args.rounds} round(s); CPU us/request:")
    for name, us in rounds.items():
        print(f"  {name:28s} {med[name]:8.1f}   (rounds: {', '.join(f'{u:.1f}' for u in us)})")
    app = {name: med[name] - med["null"] for name in ("healthz", "fleet", "conditional", "cold")}
    print("ratios (medians; 'app' less the driver's null floor):")
    for label, value in (
        ("conditional/fleet", med["conditional"] / med["fleet"]),
        ("conditional/fleet, app", app["conditional"] / app["fleet"]),
        ("cold/fleet", med["cold"] / med["fleet"]),
        ("telemetry off/on, 304", med["conditional"] / med["conditional, telemetry on"]),
        ("hop executor/anyio", med["hop executor"] / med["hop anyio"]),
    ):
        print(f"  {label:28s} {value:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
