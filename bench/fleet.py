"""Resolve at fleet scale: a catalog of 1,000,000 engines, and a fleet asking "which engine runs on me?".

A PostgreSQL catalog is filled by COPY (bench/catalogfill.py: 10,000 models x 100 engines, a realistic spread
of targets, runtime versions, precisions and benchmarks). ``enginefarm api --workers N`` serves it (PostgreSQL
catalog, Redis broker), and a lean load generator (bench/httpload.py) on the same machine sends GET /v1/resolve
with the fingerprints of seven kinds of machine. Phases:

  healthz       closed loop, GET /healthz: the floor (authentication and routing, no catalog), the baseline
  cold          closed loop, each request a random model of all of them: nearly every answer is computed
  fleet         closed loop, a fleet deploying 20 models on 7 kinds of machine: answers come from the cache
  conditional   closed loop, the fleet's questions with If-None-Match: 304s
  open-fleet    open loop at --rate over --open-connections keep-alive connections, the fleet's questions,
                latency from each request's scheduled time (no coordinated omission)
  open-cold     the same with the cold questions, at --cold-rate

For each it prints throughput, p50/p90/p99/max, errors, and the CPU the API processes and PostgreSQL spent per
request; then the ratios: conditional/cold and fleet/cold CPU per request, and each phase against /healthz.

    python bench/fleet.py                       # 1,000,000 engines, 2 API workers, 20 s phases
    python bench/fleet.py --models 1000         # 100,000 engines
    python bench/fleet.py --smoke               # 50 models x 25 engines, 1 s phases: checks that it runs
    python bench/fleet.py --phases cold         # only the phases named (no bare-server floor, no ratios)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench import catalogfill, floorapp, httpload  # noqa: E402
from bench.procstat import cpu_of  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from server.embedded import Farm, issue_token  # noqa: E402

REDIS_DB = 15
# A fleet's GPU machines accept the CPU artifact where no GPU engine of theirs is built (accept=cpu), so every kind
# of machine gets an answer, as it did before a machine that names its runtime had to ask for one.
DRIVER = {"driver": "580.82.07", "cuda": "13.0", "platform": "x86_64", "accept": "cpu"}
MACHINES = {
    "RTX 3090": {"gpu": "NVIDIA GeForce RTX 3090", "cc": "8.6", "trt_rtx": "1.7.1.116", **DRIVER},
    "L4": {"gpu": "NVIDIA L4", "cc": "8.9", "trt_rtx": "1.7.1.116", **DRIVER},
    "RTX 5090": {"gpu": "NVIDIA GeForce RTX 5090", "cc": "12.0", "trt_rtx": "1.6.0.41", **DRIVER},
    "A100": {"gpu": "NVIDIA A100-SXM4-80GB", "cc": "8.0", "trt": "10.14.1.48", **DRIVER},
    "H100": {"gpu": "NVIDIA H100 80GB HBM3", "cc": "9.0", "trt": "10.13.3.9", **DRIVER},
    "Jetson Orin": {
        "gpu": "Orin",
        "cc": "8.7",
        "trt": "10.3.0.30",
        "driver": "540.4.0",
        "cuda": "12.6",
        "platform": "aarch64",
        "jetpack": "6.2",
        "accept": "cpu",
    },
    "CPU server": {"platform": "x86_64"},
}
PHASES = ("healthz", "cold", "fleet", "conditional", "open-fleet", "open-cold")


def run_phase(name: str, coro_of, api_pid: int) -> dict:
    api = lambda: cpu_of(lambda p: p.pgrp == api_pid)  # noqa: E731
    # PostgreSQL's with the backends that ended in the window, which the postmaster reaped
    pg = lambda: cpu_of(lambda p: p.comm == "postgres", reaped=True)  # noqa: E731
    a0, p0 = api(), pg()
    res = httpload.run(coro_of())
    out = res.summary() | {"phase": name}
    n = max(1, res.ok)
    out["api_cpu_ms"] = (api() - a0) * 1000 / n
    out["pg_cpu_ms"] = (pg() - p0) * 1000 / n
    return out


def questions(models: list[str], token: str, host: str) -> list[httpload.Request]:
    auth = {"Authorization": f"Bearer {token}"}
    return [
        (httpload.request_bytes("/v1/resolve?" + urlencode({"model": m, **fp}), host, auth), 200)
        for m in models
        for fp in MACHINES.values()
    ]


def conditional(farm: Farm, fleet: list[httpload.Request], token: str) -> list[httpload.Request]:
    """The fleet's questions with the ETag of each one's current answer."""
    out = []
    with httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        for req, _status in fleet:
            path = req.split(b" ", 2)[1].decode()
            r = http.get(path)
            r.raise_for_status()
            out.append((req.replace(b"\r\n\r\n", f"\r\nIf-None-Match: {r.headers['etag']}\r\n\r\n".encode()), 304))
    return out


def show(r: dict) -> None:
    print(
        f"{r['phase']:12s} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.2f}  p90 {r['p90_ms']:7.2f}  "
        f"p99 {r['p99_ms']:7.2f}  max {r['max_ms']:7.1f} ms  errors {r['errors']}  "
        f"API {r['api_cpu_ms']:.2f} + PostgreSQL {r['pg_cpu_ms']:.2f} CPU ms/request",
        flush=True,
    )


def floor_phases(args) -> list[dict]:
    """The server's own floor (bench/floorapp.py: a bare app served as the API is, same workers): a 4.5 KB answer
    and a 304, closed loop, so the farm's cached answer and 304 can be read against what any app costs here."""
    with floorapp.served(args.api_workers) as server:
        port = server.port
        host, out = "127.0.0.1", []
        auth = {"Authorization": "Bearer floor"}
        full = httpload.request_bytes("/v1/resolve?model=m", f"{host}:{port}", auth)
        cond = httpload.request_bytes("/v1/resolve?model=m", f"{host}:{port}", {**auth, "If-None-Match": '"floor"'})
        for name, req, status in (("floor-200", full, 200), ("floor-304", cond, 304)):
            httpload.run(httpload.closed_loop(host, port, lambda k, r=req, st=status: (r, st), 4, 0.5))
            loop = httpload.closed_loop(host, port, lambda k, r=req, st=status: (r, st), args.connections, args.seconds)
            out.append(run_phase(name, lambda c=loop: c, server.pid))
            show(out[-1])
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--engines", type=int, default=100, help="engines per model")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per phase")
    parser.add_argument("--connections", type=int, default=64, help="closed-loop connections")
    parser.add_argument("--rate", type=float, default=500, help="open-fleet requests/s")
    parser.add_argument("--cold-rate", type=float, default=400, help="open-cold requests/s")
    parser.add_argument("--open-connections", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument(
        "--phases", help="comma-separated phases to run (default: all, then the bare server's floor)", default=""
    )
    parser.add_argument("--smoke", action="store_true", help="50 models x 25 engines (one of each kind), 1 s phases")
    args = parser.parse_args(argv)
    wanted = [p for p in args.phases.split(",") if p] or list(PHASES)
    if unknown := set(wanted) - set(PHASES):
        parser.error(f"unknown phase(s) {sorted(unknown)}; the phases are {', '.join(PHASES)}")
    if args.smoke:
        args.models, args.engines, args.seconds, args.rate, args.cold_rate = 50, 25, 1.0, 50, 50
        args.connections, args.open_connections = 4, 8
    with ExitStack() as stack:
        work, pg_url, env = stack.enter_context(catalogfill.scratch_catalog("enginefarm_fleet", REDIS_DB))
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
        filled = catalogfill.fill(pg_url, args.models, args.engines)
        print(
            f"catalog: {filled['models']} models, {filled['engines']} engines, {filled['benchmarks']} benchmarks "
            f"by COPY in {filled['seconds']:.1f} s",
            flush=True,
        )
        token = issue_token(settings, "fleet", ["read"])
        farm = Farm(env, log_dir=work)
        stack.callback(farm.stop)
        farm.start_api(timeout=120, workers=args.api_workers)
        host, port = farm.host, farm.port
        names = [catalogfill.model_name(i) for i in range(1, args.models + 1)]
        rng = random.Random(3)
        fleet = questions(rng.sample(names, min(20, len(names))), token, f"{host}:{port}")
        for (req, _s), kind in zip(fleet, MACHINES):  # every kind of machine gets an answer
            path = req.split(b" ", 2)[1].decode()
            r = httpx.get(farm.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert r.status_code == 200, (kind, r.status_code, r.text[:300])
        conds = conditional(farm, fleet, token)
        health = [(httpload.request_bytes("/healthz", f"{host}:{port}", {}), 200)]
        cold_rng = random.Random(11)
        fps = list(MACHINES.values())

        def cold(_k: int) -> httpload.Request:
            q = urlencode({"model": cold_rng.choice(names), **cold_rng.choice(fps)})
            return (
                httpload.request_bytes("/v1/resolve?" + q, f"{host}:{port}", {"Authorization": f"Bearer {token}"}),
                200,
            )

        def closed(pick):
            return lambda: httpload.closed_loop(host, port, pick, args.connections, args.seconds)

        def opened(pick, rate):
            return lambda: httpload.open_loop(host, port, pick, rate, args.open_connections, args.seconds)

        phases = {
            "healthz": closed(lambda k: health[0]),
            "cold": closed(cold),
            "fleet": closed(lambda k: fleet[k % len(fleet)]),
            "conditional": closed(lambda k: conds[k % len(conds)]),
            "open-fleet": opened(lambda k: fleet[k % len(fleet)], args.rate),
            "open-cold": opened(cold, args.cold_rate),
        }
        results = []
        for name in wanted:
            coro_of = phases[name]
            httpload.run(httpload.closed_loop(host, port, lambda k: health[0], 4, min(1.0, args.seconds)))  # settle
            results.append(run_phase(name, coro_of, farm.api.pid))
            show(results[-1])
        farm.stop()
        if not args.phases:
            results += floor_phases(args)
    ratios = {} if args.phases else the_ratios({r["phase"]: r for r in results})
    print(
        f"{filled['engines']} engines, {args.api_workers} API workers, {os.cpu_count()} CPUs; open loop "
        f"{args.rate:.0f} req/s (fleet) and {args.cold_rate:.0f} req/s (cold) over {args.open_connections} "
        f"connections; closed loop {args.connections}"
    )
    for k, v in ratios.items():
        print(f"  {k:36s} {v:6.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "fill": filled,
                    "phases": results,
                    "ratios": ratios,
                    "args": {k: str(v) for k, v in vars(args).items()},
                },
                indent=2,
            )
        )
    return 0 if all(r["ok"] for r in results) else 1


def the_ratios(by: dict[str, dict]) -> dict[str, float]:
    """Each phase against the others and against the bare server's floor (every phase run)."""

    def cost(p: str) -> float:
        return by[p]["api_cpu_ms"] + by[p]["pg_cpu_ms"]

    return {
        "conditional/cold CPU per request": cost("conditional") / cost("cold"),
        "fleet/cold CPU per request": cost("fleet") / cost("cold"),
        "conditional/fleet CPU per request": cost("conditional") / cost("fleet"),
        "floor 304/200 CPU per request": cost("floor-304") / cost("floor-200"),
        "fleet/floor-200 CPU per request": cost("fleet") / cost("floor-200"),
        "conditional/floor-304 CPU per request": cost("conditional") / cost("floor-304"),
        "cold/healthz throughput": by["cold"]["rps"] / by["healthz"]["rps"],
        "fleet/healthz throughput": by["fleet"]["rps"] / by["healthz"]["rps"],
        "conditional/healthz throughput": by["conditional"]["rps"] / by["healthz"]["rps"],
    }


if __name__ == "__main__":
    sys.exit(main())
