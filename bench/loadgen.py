"""The load generator of bench/load.py: client processes of asyncio + httpx clients that loop one phase's
requests (and verify every download's sha256), their latency and error records, the CPU each part of the farm
used (/proc), and one phase run from start to merged figures."""

from __future__ import annotations

import asyncio
import hashlib
import math
import multiprocessing as mp
import os
import signal
import statistics
import time
import traceback
from collections import Counter
from pathlib import Path

import httpx

from bench.procstat import TICK, processes
from enginefarm.core.hashing import CHUNK, SHA_HEADER

# ============================================================================== the clients (child processes)


class Recorder:
    """What one client process saw: latencies of operations that finished inside the window, errors by kind."""

    def __init__(self, window: tuple[float, float]):
        self.t0, self.t1 = window
        self.lat: dict[str, list[float]] = {}
        self.bytes: Counter = Counter()
        self.errors: Counter = Counter()
        self.errors_outside: Counter = Counter()  # during the warm-up or after the window: reported apart
        self.verified = 0
        self.cpu_s = 0.0  # this process's CPU over the window

    def counts(self, now: float) -> bool:
        return self.t0 <= now <= self.t1

    def ok(self, op: str, started: float, ended: float, nbytes: int = 0) -> None:
        if self.counts(ended):
            self.lat.setdefault(op, []).append(ended - started)
            self.bytes[op] += nbytes

    def error(self, kind: str, ended: float) -> None:
        (self.errors if self.counts(ended) else self.errors_outside)[kind] += 1


def _exc_kind(op: str, exc: BaseException) -> str:
    return f"{op}: {type(exc).__name__}"


async def _get_verified(
    http: httpx.AsyncClient,
    url: str,
    op: str,
    expect_sha: str,
    expect_size: int,
    rec: Recorder,
    headers: dict | None = None,
) -> tuple[bool, float | None]:
    """Stream ``url`` (following the farm's redirect to S3, as the client does), hash it, check it. Returns (ok,
    seconds to the response headers)."""
    started = time.perf_counter()
    async with http.stream("GET", url, headers=headers, follow_redirects=True) as r:
        t_headers = time.perf_counter() - started
        if r.status_code != 200:
            await r.aread()
            rec.error(f"{op}: HTTP {r.status_code}", time.perf_counter())
            return False, t_headers
        h, n = hashlib.sha256(), 0
        async for chunk in r.aiter_raw(CHUNK):
            h.update(chunk)
            n += len(chunk)
        header_sha = (r.history[0] if r.history else r).headers.get(SHA_HEADER)  # the farm's answer, not S3's
    ended = time.perf_counter()
    digest = h.hexdigest()
    if n != expect_size:
        rec.error(f"{op}: size {n}, catalog says {expect_size}", ended)
        return False, t_headers
    if digest != expect_sha:
        rec.error(f"{op}: sha256 differs from the catalog's", ended)
        return False, t_headers
    if op == "download" and header_sha != expect_sha:
        rec.error(f"{op}: {SHA_HEADER} header {'missing' if header_sha is None else 'differs'}", ended)
        return False, t_headers
    rec.ok(op, started, ended, n)
    if rec.counts(ended):
        rec.verified += 1
    return True, t_headers


async def _client(i: int, phase: str, http: httpx.AsyncClient, cfg: dict, rec: Recorder, stop_at: float) -> None:
    m = cfg["machines"][i % len(cfg["machines"])]
    auth = cfg["headers"]
    body = {"model": cfg["model"], "version": cfg["version"], "machine": m["machine"]}
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        op = "healthz" if phase == "healthz" else "s3" if phase == "s3" else "resolve"
        try:
            if phase == "healthz":
                r = await http.get("/healthz", headers=auth)
                ended = time.perf_counter()
                if r.status_code == 200:
                    rec.ok("healthz", started, ended)
                else:
                    rec.error(f"healthz: HTTP {r.status_code}", ended)
            elif phase == "s3":
                await _get_verified(http, m["presigned_url"], "s3", m["sha256"], m["size"], rec)
            else:
                r = await http.post("/v1/resolve", json=body, headers=auth)
                t_resolved = time.perf_counter()
                if r.status_code != 200:
                    rec.error(f"resolve: HTTP {r.status_code}", t_resolved)
                    continue
                answer = r.json()
                engine = answer["engine"]
                if engine["id"] != m["engine_id"] or engine["sha256"] != m["sha256"]:
                    rec.error(
                        f"resolve: chose engine {engine['id']} ({engine['target']}), expected {m['engine_id']}",
                        t_resolved,
                    )
                    continue
                rec.ok("resolve", started, t_resolved)
                op = "download"
                ok, t_headers = await _get_verified(
                    http, answer["download_url"], "download", m["sha256"], m["size"], rec, headers=auth
                )
                ended = time.perf_counter()
                if t_headers is not None and rec.counts(ended):
                    rec.lat.setdefault("download headers", []).append(t_headers)
                if ok:
                    rec.ok("cycle", started, ended)
        except Exception as exc:  # noqa: BLE001 - every failure is counted by kind, none ends the run
            rec.error(_exc_kind(op, exc), time.perf_counter())
            await asyncio.sleep(0.05)  # a refused connection must not turn into a busy loop


async def _run_clients(ids: list[int], phase: str, cfg: dict, go_at: float) -> Recorder:
    n = len(ids)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(cfg["timeout"], connect=min(30.0, cfg["timeout"]))
    # One connection per client: the pool never makes a client wait for another's connection.
    async with httpx.AsyncClient(base_url=cfg["url"], limits=limits, timeout=timeout, trust_env=False) as http:
        # Wall clock to line the processes up, perf_counter for everything measured.
        await asyncio.sleep(max(0.0, go_at - time.time()))
        start = time.perf_counter()
        window = (start + cfg["warmup"], start + cfg["warmup"] + cfg["seconds"])
        rec = Recorder(window)

        async def cpu_over_window() -> None:
            await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
            t0 = os.times()
            await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
            t1 = os.times()
            rec.cpu_s = (t1.user - t0.user) + (t1.system - t0.system)

        await asyncio.gather(cpu_over_window(), *(_client(i, phase, http, cfg, rec, window[1]) for i in ids))
    return rec


def client_process(ids: list[int], phase: str, cfg: dict, ready, go, go_at, results) -> None:
    """One client process: its share of the clients, on one event loop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent cleans up; a Ctrl-C just ends us
    try:
        ready.put(os.getpid())
        go.wait()
        rec = asyncio.run(_run_clients(ids, phase, cfg, go_at.value))
        results.put(
            {
                "pid": os.getpid(),
                "lat": rec.lat,
                "bytes": dict(rec.bytes),
                "errors": dict(rec.errors),
                "errors_outside": dict(rec.errors_outside),
                "verified": rec.verified,
                "cpu_s": rec.cpu_s,
            }
        )
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        results.put({"pid": os.getpid(), "fatal": "".join(traceback.format_exception(exc))})


# ============================================================================== CPU accounting (/proc)


def proc_stats() -> dict[int, tuple[int, str, float]]:
    """pid -> (process group, comm, CPU seconds so far) for every process we can read."""
    return {pid: (p.pgrp, p.comm, p.cpu) for pid, p in processes().items()}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    total = sum(vals[:8])
    return (total - idle) / TICK, total / TICK


class CpuMeter:
    """CPU seconds of the farm's parts over a window: by process group (API, workers, SeaweedFS) and the
    PostgreSQL backends of the scratch database (matched by their command line), per pid, so a process that
    appears in the window counts from its start (one that exits in it is lost: see "sessions" for the
    database). Plus the whole machine's busy time, and the scratch database's pg_stat_database counters."""

    PG_STATS = ("sessions", "xact_commit", "xact_rollback", "active_time", "tup_returned")

    def __init__(self, groups: dict[str, list[int]], pg_db: str, api_pid: int):
        self.groups, self.pg_db, self.api_pid = groups, pg_db, api_pid
        self.watched: dict = {}

    def watch(self, until: float, every: float = 1.0) -> None:
        """Until ``until`` (wall clock), once a second: the API's worker processes (uvicorn replaces one that
        misses its health check) and the scratch database's connections by state (pg_stat_activity)."""
        import psycopg

        from server.localservers import PG_ADMIN

        seen: set[int] = set()
        conns: Counter = Counter()
        samples = 0
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            while True:
                seen |= {
                    pid
                    for pid, (pgrp, _c, _cpu) in proc_stats().items()
                    if pgrp == self.api_pid and "spawn_main" in cmdline(pid)
                }  # not the resource tracker
                rows = conn.execute(
                    "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
                    (self.pg_db,),
                ).fetchall()
                now = {state: n for state, n in rows}
                now["all"] = sum(now.values())
                for state, n in now.items():
                    conns[state] = max(conns[state], n)
                samples += 1
                if time.time() + every > until:
                    break
                time.sleep(every)
        time.sleep(max(0.0, until - time.time()))
        self.watched = {"api_processes": len(seen), "db_connections_max": dict(conns), "samples": samples}

    def sample(self) -> dict:
        stats = proc_stats()
        per: dict[str, dict[int, float]] = {name: {} for name in self.groups} | {"PostgreSQL": {}}
        for pid, (pgrp, comm, cpu) in stats.items():
            for name, pgids in self.groups.items():
                if pgrp in pgids:
                    per[name][pid] = cpu
            if comm == "postgres" and f" {self.pg_db} " in cmdline(pid):
                per["PostgreSQL"][pid] = cpu
        busy, total = machine_busy()
        return {"per": per, "busy": busy, "total": total, "pg": self._pg_stats()}

    def _pg_stats(self) -> dict[str, float]:
        import psycopg

        from server.localservers import PG_ADMIN

        try:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                row = conn.execute(
                    f"SELECT {', '.join(self.PG_STATS)} FROM pg_stat_database WHERE datname = %s", (self.pg_db,)
                ).fetchone()
        except Exception:  # noqa: BLE001 - statistics are extra; never fail the run for them
            return {}
        return dict(zip(self.PG_STATS, (float(x or 0) for x in row))) if row else {}

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        out = {
            name: sum(cpu - a["per"][name].get(pid, 0.0) for pid, cpu in pids.items())
            for name, pids in b["per"].items()
        }
        out["machine busy"] = b["busy"] - a["busy"]
        out["machine total"] = b["total"] - a["total"]
        out["pg"] = {k: b["pg"][k] - a["pg"][k] for k in b["pg"] if k in a["pg"]}
        return out


# ============================================================================== a phase


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s) / 100 - 1e-9) - 1))]  # nearest rank


def run_phase(phase: str, cfg: dict, procs: int, meter: CpuMeter) -> dict:
    """Start the client processes, line them up, run the phase, collect and merge what they saw."""
    ctx = mp.get_context("spawn")
    ready, results, go, go_at = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    shares = [list(range(cfg["clients"]))[k::procs] for k in range(procs)]
    children = [
        ctx.Process(target=client_process, args=(ids, phase, cfg, ready, go, go_at, results), daemon=True)
        for ids in shares
        if ids
    ]
    try:
        for p in children:
            p.start()
        for _ in children:
            ready.get(timeout=120)
        go_at.value = time.time() + 1.0
        go.set()
        # CPU of the farm's parts over the measured window only.
        t_window = go_at.value + cfg["warmup"]
        time.sleep(max(0.0, t_window - time.time()))
        cpu0 = meter.sample()
        meter.watch(t_window + cfg["seconds"])
        cpu1 = meter.sample()
        parts = []
        deadline = time.monotonic() + cfg["timeout"] + 60
        while len(parts) < len(children):
            parts.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
        for p in children:
            p.join(30)
    finally:
        for p in children:
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    fatal = [p["fatal"] for p in parts if "fatal" in p]
    if fatal:
        raise RuntimeError(f"a client process of phase {phase} failed:\n" + fatal[0])
    merged: dict = {
        "lat": {},
        "bytes": Counter(),
        "errors": Counter(),
        "errors_outside": Counter(),
        "verified": 0,
        "client_cpu_s": 0.0,
        "seconds": cfg["seconds"],
    }
    for p in parts:
        for op, lats in p["lat"].items():
            merged["lat"].setdefault(op, []).extend(lats)
        merged["bytes"].update(p["bytes"])
        merged["errors"].update(p["errors"])
        merged["errors_outside"].update(p["errors_outside"])
        merged["verified"] += p["verified"]
        merged["client_cpu_s"] += p["cpu_s"]
    merged["cpu"] = CpuMeter.delta(cpu0, cpu1)
    merged["server"] = meter.watched
    return merged


def summarize(phase: dict) -> dict:
    secs = phase["seconds"]
    ops = {}
    for op, lats in phase["lat"].items():
        ops[op] = {
            "n": len(lats),
            "per_s": len(lats) / secs,
            "mb_s": phase["bytes"].get(op, 0) / secs / 1e6,
            "mean": statistics.fmean(lats) if lats else float("nan"),
            **{f"p{q}": pct(lats, q) for q in (50, 90, 99)},
            "max": max(lats) if lats else float("nan"),
        }
    return {
        "ops": ops,
        "errors": dict(phase["errors"]),
        "error_total": sum(phase["errors"].values()),
        "errors_outside": dict(phase["errors_outside"]),
        "verified": phase["verified"],
        "cpu": phase["cpu"],
        "client_cpu_s": phase["client_cpu_s"],
        "server": phase["server"],
        "mb_s": sum(phase["bytes"].values()) / secs / 1e6,
    }
