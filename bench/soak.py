"""Soak: a farm under a steady mixed workload for as long as asked, its resources sampled and their slopes judged.

Modes: ``embedded`` (the farm as ``enginefarm up`` runs it: SQLite catalog and broker, local blobs, the API and one
worker) and ``distributed`` (a fresh PostgreSQL database, Redis db 7 flushed, SeaweedFS S3, the API and two
workers with split targets). The workload (bench/soak_load.py): uploads, builds (CPU + a GPU target whose
benchmark waits for ever; fp16, fp32, int8, int8 with repair), build long polls, resolves, 304s, verified downloads,
the dashboard's long poll, tokens made, used and revoked. Meanwhile a worker is SIGKILLed and started again at
intervals, and the API is restarted once. Every few seconds each farm process's RSS, descriptors and threads, the
catalog's connections, the queues' depths and the sizes on disk are sampled (bench/soak_sample.py); each series
gets a least-squares slope after a warm-up (bench/soak_judge.py), failing when it would double the resource in a
day (``--smoke``: in an hour: the run is too short for more than gross leaks).

    python bench/soak.py --mode both --minutes 60 [--out soak-out]
    python bench/soak.py --mode embedded --smoke        # ~150 s per mode, reconciler every 0.5 s
    python bench/soak.py --judge soak-out/embedded/soak.json   # a saved run's samples judged again

Exit code 1 and a ``FAIL`` line per cause on any error, request over its bound, task not done in its bound,
growing resource, or a traceback in the farm's logs. Plots and soak.json go to OUT/<mode>/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import soak_judge  # noqa: E402
from bench.soak_load import CPU, GPUS, Bounds, Rates, Record, Workload  # noqa: E402
from bench.soak_sample import Sampler, du_mb, redis_queue_depths, sqlite_queue_depths  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from server import localservers  # noqa: E402
from server.embedded import Farm, embedded_env, issue_token  # noqa: E402

REDIS_DB = int(os.environ.get("ENGINEFARM_SOAK_REDIS_DB", "7"))  # flushed at the start: a db of its own
WAL_MAX_MB = 16.0  # four autocheckpoints
LOG_PROBLEMS = re.compile(r"Traceback|reconciler pass failed|could not publish")


def start_farm(
    mode: str, work: Path, stack: ExitStack, reconcile: float | None, trace: Path | None = None
) -> tuple[Farm, dict, dict]:
    """The farm of ``mode``, started; returns it, its workers' arguments and what the sampler reads. ``trace``: a
    folder for the API's allocation growth (bench/soakprobe: slower, and its traces cost memory)."""
    data = work / "data"
    extra = {"PROMETHEUS_MULTIPROC_DIR": str(work / "metrics")}
    if trace:
        trace.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(filter(None, [str(ROOT / "bench" / "soakprobe"), os.environ.get("PYTHONPATH")]))
        extra |= {"PYTHONPATH": path, "ENGINEFARM_SOAK_TRACE_DIR": str(trace.resolve())}
    (work / "metrics").mkdir()
    if reconcile is not None:  # frequent passes show a leak of something per pass within minutes
        extra |= {"ENGINEFARM_RECONCILE_SECONDS": str(reconcile), "ENGINEFARM_REPUBLISH_AFTER_SECONDS": "5"}
    if mode == "embedded":
        env = embedded_env(data) | extra
        settings = Settings(data_dir=data, blob_store="local")
        workers = {"w": ([*GPUS, CPU], [CPU])}
        info = {"data": data, "blobs": data / "blobs"}
    else:
        import redis

        if not (localservers.port_open(5432) and localservers.port_open(6379)):
            subprocess.run(["bash", str(ROOT / "deploy" / "services.sh")], check=True)
        pg_url = stack.enter_context(localservers.scratch_postgres("soak"))
        r = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
        r.flushdb()
        s3 = stack.enter_context(localservers.seaweedfs(work / "seaweedfs"))
        env = localservers.distributed_env(data, pg_url, f"redis://127.0.0.1:6379/{REDIS_DB}", s3) | extra
        settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items() if "ENGINEFARM_" in k})
        workers = {
            "worker-a": (["tensorrt-rtx/sm80", GPUS[0]], []),
            "worker-b": ([GPUS[1], "tensorrt-rtx/sm120", CPU], [CPU]),
        }
        info = {"data": data, "blobs": work / "seaweedfs", "pg_db": pg_url.rsplit("/", 1)[1], "redis": r}
    farm = Farm({k: v for k, v in os.environ.items() if not k.startswith("ENGINEFARM_")} | env, log_dir=work)
    stack.callback(farm.stop)
    farm.token = issue_token(settings, "soak", ["admin"])
    farm.start_api(timeout=120)
    for name, (targets, bench) in workers.items():
        farm.start_worker(name, targets, bench_targets=bench)
    farm.wait_workers(list(workers), timeout=180)
    return farm, workers, info


def shared_reader(mode: str, info: dict, work: Path):
    data = info["data"]

    def embedded() -> dict[str, float]:
        out = {f"queue|{q}": n for q, n in sqlite_queue_depths(data / "broker.db").items()}
        for f in ("catalog.db", "catalog.db-wal", "broker.db", "broker.db-wal"):
            out[f"disk_mb|{f}"] = (data / f).stat().st_size / 2**20 if (data / f).exists() else 0.0
        out["disk_mb|data_dir"] = du_mb(data)
        out["disk_mb|blobs"] = du_mb(info["blobs"])
        out["disk_mb|metrics"] = du_mb(work / "metrics")
        return out

    def distributed() -> dict[str, float]:
        import psycopg

        out = {f"queue|{q}": n for q, n in redis_queue_depths(info["redis"]).items()}
        with psycopg.connect(localservers.PG_ADMIN, autocommit=True) as conn:
            (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (info["pg_db"],)).fetchone()
        out["db_connections|farm"] = n
        out["disk_mb|data_dir"] = du_mb(data)
        out["disk_mb|seaweedfs"] = du_mb(info["blobs"])
        out["disk_mb|metrics"] = du_mb(work / "metrics")
        return out

    return embedded if mode == "embedded" else distributed


def kill_worker(farm: Farm, name: str, workers: dict, rec: Record) -> int:
    """SIGKILL a worker's process group once one runs a task (``name`` if both do; ``name`` after 30 s of none), then
    start it again; returns the number of tasks it was running."""
    import httpx

    running, deadline = [], time.monotonic() + 30
    while not running and time.monotonic() < deadline:
        try:
            builds = httpx.get(f"{farm.url}/v1/builds", params={"limit": 20}, headers=farm.headers, timeout=10).json()
        except httpx.HTTPError:
            builds = []
        busy = {
            (t["worker_id"] or "").split("@")[0]: t["id"] for b in builds for t in b["tasks"] if t["state"] == "running"
        }
        if busy.keys() & workers.keys():
            name = name if name in busy else next(n for n in workers if n in busy)
            running = [busy[name]]
        time.sleep(0.5)
    proc = farm.workers[name]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    rec.events.append(time.monotonic())
    rec.notes.append(f"t={time.monotonic() - rec.t0:.0f} s: {name} SIGKILLed while running tasks {running}")
    farm.start_worker(name, workers[name][0], bench_targets=workers[name][1])
    return len(running)


def restart_api(farm: Farm, rec: Record) -> float:
    """SIGTERM the API, start it again; returns the seconds it did not answer."""
    window = [time.monotonic(), 0.0]
    rec.down.append(window)
    Farm.stop_process(farm.api, signal.SIGTERM, timeout=30)
    farm.start_api(timeout=120)
    window[1] = time.monotonic()
    rec.events += window
    rec.notes.append(f"t={window[0] - rec.t0:.0f} s: API restarted, {window[1] - window[0]:.1f} s without answers")
    return window[1] - window[0]


def soak(mode: str, args, rates: Rates, bounds: Bounds) -> bool:
    out = Path(args.out) / mode
    out.mkdir(parents=True, exist_ok=True)
    duration = args.minutes * 60
    print(f"soak: {mode}, {duration:.0f} s, out {out}", flush=True)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"soak-{mode}-")))
        trace = Path(args.trace_api) / mode if args.trace_api else None
        farm, workers, info = start_farm(mode, work, stack, args.reconcile_seconds, trace)
        data = info["data"]
        db_files = None
        if mode == "embedded":
            db_files = {str(data / f) + x for f in ("catalog.db", "broker.db") for x in ("", "-wal", "-shm")}
        groups = lambda: {"api": farm.api.pid, **{n: p.pid for n, p in farm.workers.items()}}  # noqa: E731
        sampler = Sampler(args.sample_seconds, groups, shared_reader(mode, info, work), db_files)
        rec = Record(rates, bounds)
        load = Workload(farm.url, farm.token, work, rec)
        sampler.t0 = rec.t0 = time.monotonic()
        sampler.start()
        load.start()
        kills, in_flight, downtime = 0, 0, None
        kill_every = duration * 0.35 if args.smoke else args.kill_every
        # The API restarts late, so its first life is long enough to judge its memory after the warm-up.
        next_kill, restart_at, stop_builds = kill_every, duration * (0.7 if args.smoke else 0.8), duration * 0.85
        names = list(workers)
        while (elapsed := time.monotonic() - rec.t0) < duration:
            if elapsed >= next_kill:
                name = names[kills % len(names)]
                in_flight += kill_worker(farm, name, workers, rec)
                kills += 1
                next_kill = float("inf") if args.smoke else next_kill + kill_every
            elif downtime is None and elapsed >= restart_at:
                downtime = restart_api(farm, rec)
            elif elapsed >= stop_builds:
                rates.build = float("inf")  # builds submitted from here would not finish before the end
            time.sleep(0.5)
        sampler.stop()
        load.finish(timeout=bounds.build)
        unsettled = [b for b in load.builds.values() if b["state"] == "queued"]
        farm.stop()
        logs = {p.name: p.read_text(errors="replace") for p in sorted(work.glob("*.log"))}
        for name, text in logs.items():  # kept for reading after the scratch folder is gone
            (out / name).write_text(text)
    return report(mode, out, args, sampler, rec, load, logs, kills, in_flight, downtime, unsettled)


def by_design_of(mode: str, smoke: bool) -> dict[str, str]:
    """A substring of a series' name -> why it grows by design (reported, not failed)."""
    by_design = {
        "queue|bench.tensorrt-rtx": "one message per GPU benchmark that waits for a GPU this farm lacks",
        "catalog.db": "catalog rows: every upload adds a model version, every build its rows",
        "|broker.db": "the broker's file keeps the GPU benchmarks' messages",
        # A WAL is reused after each checkpoint: it stays at the autocheckpoint's size (1,000 pages, about 4 MB)
        # while checkpoints complete; one starved by a read never ended grows without end (judged in report).
        "-wal": "SQLite's WAL, reused after each checkpoint",
        "disk_mb|metrics": "prometheus-client keeps a file per process that ever ran",
        # The two parts of rss_mb, which is judged: they tell a heap that grows from files mapped.
        "rss_anon_mb": "the anonymous part of rss_mb (the heaps)",
        "rss_file_mb": "the rest of rss_mb (files mapped, shared memory)",
    }
    if mode == "embedded":
        by_design["disk_mb|data_dir"] = "holds the catalog, which grows by design"
        # The local store's counterpart of SeaweedFS's volumes below: the collector deletes only bytes no row points at.
        by_design["disk_mb|blobs"] = "every upload adds a model version's bytes and every build its engines"
    if mode == "distributed":
        by_design["disk_mb|seaweedfs"] = "SeaweedFS appends to its volumes and logs; compaction is its own"
    if smoke:  # the fixed set of engines is still being built: bytes on disk rise towards their bound
        by_design["disk_mb"] = "disk in a smoke run: engines of the fixed set are still being added"
    return by_design


def judged(samples: list[dict], mode: str, smoke: bool, duration: float, events: list[float]):
    """The verdicts on a run's samples, its warm-up and horizon."""
    # Caches fill and pools open in a process's first minutes: judged after 10 min or a third of the run.
    warmup = max(duration / 3, 600.0) if not smoke else 0.3 * duration
    horizon = soak_judge.HOUR if smoke else soak_judge.DAY
    by_design = by_design_of(mode, smoke)
    # A day's slope is judged over 10 minutes at least (a smoke run's few minutes are judged for gross leaks only).
    span = 0.0 if smoke else 600.0
    return soak_judge.judge(samples, warmup, horizon, by_design, events, gross=smoke, min_span_s=span), warmup, horizon


def rejudge(path: Path) -> int:
    """Judge a saved run's samples (``OUT/MODE/soak.json``) again, with this judge; exit 1 on a slope's FAIL."""
    saved = json.loads(path.read_text())
    events = saved.get("events")
    if events is None:  # a report saved before its events were: they are in its notes
        events = [float(m) for n in saved["notes"] for m in re.findall(r"^t=(\d+) s", n)]
    verdicts, _, _ = judged(saved["samples"], saved["mode"], saved["smoke"], saved["seconds"], events)
    print(soak_judge.table(verdicts))
    fails = verdict_fails(verdicts)
    for line in fails:
        print(line)
    return 1 if fails else 0


def verdict_fails(verdicts) -> list[str]:
    """The FAIL lines the verdicts give: a slope, or a WAL past its bound."""
    fails = [
        f"FAIL slope: {v.series}: {v.per_day:+.1f}/day against a mean of {v.mean:.1f} ({v.why})"
        for v in verdicts
        if v.verdict == "FAIL"
    ]
    return fails + [
        f"FAIL {v.series}: {v.last:.1f} MB, past {WAL_MAX_MB} MB: checkpoints starved (a read never ended)"
        for v in verdicts
        if v.series.endswith("-wal") and max(v.last, v.mean) > WAL_MAX_MB
    ]


def report(mode, out, args, sampler, rec, load, logs, kills, in_flight, downtime, unsettled) -> bool:
    smoke = args.smoke
    duration = args.minutes * 60
    events = [e - rec.t0 for e in rec.events]
    verdicts, warmup, horizon = judged(sampler.samples, mode, smoke, duration, events)
    print(soak_judge.table(verdicts))
    fails = verdict_fails(verdicts)
    fails += [f"FAIL error: {e}" for e in rec.errors[:30]]
    if len(rec.errors) > 30:
        fails.append(f"FAIL error: ... and {len(rec.errors) - 30} more")
    fails += [f"FAIL over bound: {s}" for s in rec.slow[:30]]
    fails += [f"FAIL sampler: {e}" for e in sampler.errors]
    fails += [f"FAIL build {i} ({b['kind']}) never settled" for i, b in load.builds.items() if b in unsettled]
    if downtime is not None and downtime > rec.bounds.api_down:
        fails.append(f"FAIL API restart: {downtime:.1f} s without answers (bound {rec.bounds.api_down:.0f} s)")
    for name, text in logs.items():
        for m in LOG_PROBLEMS.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1 : text.find("\n", m.end())]
            fails.append(f"FAIL log {name}: {line.strip()[:200]}")
    done = [b for b in load.builds.values() if b.get("done")]
    lat = {k: sorted(v) for k, v in rec.lat.items()}
    print(
        f"builds: {len(load.builds)} submitted, {len(done)} done in bound; "
        f"worker kills: {kills} ({in_flight} tasks in flight)"
    )
    for k, v in sorted(lat.items()):
        bound = rec.bounds.of(k, rec.rates)
        print(f"  {k:12} n={len(v):5d} p50={v[len(v) // 2]:.3f} s max={v[-1]:.3f} s (bound {bound:.1f} s)")
    print(
        f"API restart: {downtime if downtime is None else round(downtime, 1)} s down; "
        f"{rec.restart_window} requests failed in the restart window (not errors)"
    )
    for note in rec.notes[:20]:
        print(f"  note: {note}")
    if smoke:
        print(
            "soak: smoke run: too short for the one-day criterion; judged for gross leaks only "
            "(doubling within an hour, and a rise past the kind's floor within the run)"
        )
    pngs = soak_judge.plot(sampler.samples, out, f"soak {mode}")
    soak_judge.write_report(
        out,
        sampler.samples,
        verdicts,
        {
            "mode": mode,
            "smoke": smoke,
            "seconds": duration,
            "warmup_s": warmup,
            "horizon_s": horizon,
            "rates": vars(rec.rates),
            "bounds": vars(rec.bounds),
            "latency": {k: {"n": len(v), "p50": v[len(v) // 2], "max": v[-1]} for k, v in lat.items()},
            "builds": {str(i): b for i, b in load.builds.items()},
            "errors": rec.errors,
            "slow": rec.slow,
            "restart_window_failures": rec.restart_window,
            "api_downtime_s": downtime,
            "worker_kills": kills,
            "tasks_in_flight_at_kills": in_flight,
            "notes": rec.notes,
            "events": events,
            "fails": fails,
        },
    )
    print(f"soak: wrote {len(pngs)} plots and soak.json to {out}")
    for f in fails:
        print(f)
    print(f"soak: {mode} worst slope/day ratio {soak_judge.worst_ratio(verdicts):.2f}")
    print(f"soak: {mode} {'PASS' if not fails else 'FAIL'}", flush=True)
    return not fails


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("embedded", "distributed", "both"), default="both")
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--out", default="soak-out")
    p.add_argument("--smoke", action="store_true", help="~150 s per mode, frequent reconciler passes")
    p.add_argument("--sample-seconds", type=float, default=10.0)
    p.add_argument("--kill-every", type=float, default=600.0, help="seconds between worker kills")
    p.add_argument(
        "--trace-api", metavar="DIR", help="trace the API's Python allocations (bench/soakprobe), growth written to DIR"
    )
    p.add_argument("--reconcile-seconds", type=float, help="ENGINEFARM_RECONCILE_SECONDS (default: the farm's)")
    p.add_argument("--upload-every", type=float, default=20.0)
    p.add_argument("--build-every", type=float, default=30.0)
    p.add_argument("--resolve-every", type=float, default=1.0, help="seconds between resolve rounds")
    p.add_argument("--token-every", type=float, default=20.0)
    p.add_argument("--build-bound", type=float, default=300.0, help="seconds from submit to a settled build")
    p.add_argument("--judge", type=Path, metavar="SOAK_JSON", help="judge a saved run's samples again, and stop")
    args = p.parse_args(argv)
    if args.judge:
        return rejudge(args.judge)
    if args.smoke:
        args.minutes, args.sample_seconds = 2.5, 5.0
        args.upload_every, args.build_every, args.token_every = 10.0, 12.0, 8.0
        args.reconcile_seconds = 0.5 if args.reconcile_seconds is None else args.reconcile_seconds
        args.build_bound = min(args.build_bound, 180.0)
    rates_of = lambda: Rates(args.upload_every, args.build_every, args.resolve_every, args.token_every)  # noqa: E731
    ok = True
    for mode in ("embedded", "distributed") if args.mode == "both" else (args.mode,):
        ok &= soak(mode, args, rates_of(), Bounds(build=args.build_bound))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
