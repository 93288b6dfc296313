"""Load benchmark: many clients resolving and downloading engines from a distributed farm at once.

The farm is the distributed one, started here: the API under uvicorn with several worker processes,
PostgreSQL (a scratch database), Redis (db 13, flushed), SeaweedFS (S3, started on free ports) and
Celery worker processes. One model is built for ``tensorrt-rtx/sm86``, ``tensorrt-rtx/sm89`` and
``onnxruntime/cpu-x86_64`` (no benchmark or accuracy stage). Then N concurrent clients (asyncio +
httpx, spread over one or more client processes) run three phases of the same length, each after a
warm-up that is not counted:

  healthz  every client loops GET /healthz: the API's own cost per request (routing, a catalog
           session, SELECT 1), the request-overhead baseline;
  s3       every client loops a presigned GET of its engine straight from SeaweedFS (sha256 checked):
           the download baseline, the same bytes without the farm;
  farm     every client loops POST /v1/resolve with its machine (half RTX 3090-like sm86 machines,
           half RTX 4090-like sm89), then GETs the download_url it was given; each engine's sha256
           is checked against the X-Content-SHA256 header, the resolve answer and the catalog.

It prints throughput (requests/s, cycles/s, MB/s), p50/p90/p99/max latency per operation, every error
by kind (any non-2xx, exception or failed check), the CPU the farm's parts and the clients used, and
the ratios farm / baseline. Every request to the API carries ``Authorization: Bearer <token>`` from
``enginefarm token create`` (a warning, and no header, where that command does not exist).

    python bench/load.py                                  # 200 clients, 60 s per phase, 2 API workers
    python bench/load.py --clients 50 --seconds 20 --api-workers 4 --client-procs 2 --json load.json
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

import httpx  # noqa: E402

from bench.loadgen import CpuMeter, cmdline, proc_stats, run_phase, summarize  # noqa: E402

TARGETS = ["tensorrt-rtx/sm86", "tensorrt-rtx/sm89", "onnxruntime/cpu-x86_64"]
WORKERS = {"load-gpu": ["tensorrt-rtx/sm86", "tensorrt-rtx/sm89"], "load-cpu": ["onnxruntime/cpu-x86_64"]}
NO_CHECKS = {"benchmark": {"enabled": False}, "accuracy": {"enabled": False}}
# The clients' machines: the GPU name and compute capability pick the engine; the runtime versions
# are filled in from the engines the farm built.
MACHINES = [
    {
        "name": "sm86",
        "target": "tensorrt-rtx/sm86",
        "machine": {
            "gpu_name": "NVIDIA GeForce RTX 3090",
            "compute_capability": "8.6",
            "memory_mib": 24576,
            "platform": "x86_64",
        },
    },
    {
        "name": "sm89",
        "target": "tensorrt-rtx/sm89",
        "machine": {
            "gpu_name": "NVIDIA GeForce RTX 4090",
            "compute_capability": "8.9",
            "memory_mib": 24564,
            "platform": "x86_64",
        },
    },
]
# A Redis db of its own: the test suite's session farms use 11 and 13 (tests/conftest.py), and this bench's smoke runs
# beside them; flushing one of theirs lost their queued builds.
REDIS_DB = int(os.environ.get("ENGINEFARM_LOAD_REDIS_DB", "4"))
PHASES = ("healthz", "s3", "farm")


# ============================================================================== the farm and the report
def machine_info() -> dict:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    return {
        "nproc": os.cpu_count(),
        "client_cpus": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "mem_gib": round(mem_kb / (1 << 20), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def create_token(env: dict, console) -> str | None:
    """``enginefarm token create --scope build``: the token is stdout's last line. None where it fails."""
    cmd = [sys.executable, "-m", "enginefarm", "token", "create", "--scope", "build", "--name", "load-bench"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done, err = None, str(exc)
    lines = done.stdout.strip().splitlines() if done is not None else []
    if done is not None and done.returncode == 0 and lines and lines[-1].strip():
        return lines[-1].strip()
    if done is not None:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("(Background")]
        err = next(
            (ln for ln in reversed(lines) if "Error" in ln or "error" in ln),
            lines[-1] if lines else f"exit code {done.returncode}",
        )
    console.print(
        f"[yellow]warning: `enginefarm token create` failed ({err[:200]}); "
        "running without an Authorization header[/yellow]",
        highlight=False,
    )
    return None


def make_client(url: str, token: str | None):
    from enginefarm.client import Client

    kwargs = {"token": token} if token and "token" in inspect.signature(Client.__init__).parameters else {}
    client = Client(url, timeout=300, **kwargs)
    if token:
        client.http.headers["Authorization"] = f"Bearer {token}"
    return client


def dump_logs(log_dir: Path, console) -> None:
    for log in sorted(log_dir.glob("*.log")):
        tail = log.read_text(errors="replace")[-3000:]
        if "Traceback" in tail or "Error" in tail:
            console.print(f"[red]--- {log} ---[/red]\n{tail}", highlight=False)


def log_problems(log_dir: Path) -> dict[str, dict[str, int]]:
    """Per farm log: how many tracebacks and WARNING/ERROR lines it holds, and the most common last lines."""
    out = {}
    for log in sorted(log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        lines = text.splitlines()
        kinds = Counter()
        for k, line in enumerate(lines):
            if line.startswith("Traceback"):
                # The exception line closes the traceback: the first unindented line after it.
                end = next((lines[j] for j in range(k + 1, len(lines)) if lines[j] and not lines[j][0].isspace()), "")
                kinds[f"traceback: {end[:160]}"] += 1
            elif " WARNING " in line or " ERROR " in line or line.startswith(("WARNING", "ERROR")):
                kinds[line[:160]] += 1
        if kinds:
            out[log.name] = dict(kinds.most_common(8))
    return out


def setup_farm(args, work: Path, stack: ExitStack, console) -> dict:
    """Servers, farm, token, one model built for TARGETS; returns what the clients need."""
    import redis

    from enginefarm.core.config import Settings
    from enginefarm.graph.samples import sample_spec, save_conv_net
    from server import localservers
    from server.embedded import Farm
    from storage.blobs import engine_key
    from storage.blobs.s3 import S3BlobStore

    if not (localservers.port_open(5432) and localservers.port_open(6379)):
        subprocess.run(["bash", str(ROOT / "deploy" / "services.sh")], check=True)
    weed_dir = work / "seaweedfs"
    endpoint = stack.enter_context(localservers.seaweedfs(weed_dir))
    pg_url = stack.enter_context(localservers.scratch_postgres("enginefarm_load"))
    broker = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    broker.flushdb()
    stack.callback(broker.flushdb)
    env = localservers.distributed_env(work / "farm-data", pg_url, f"redis://127.0.0.1:6379/{REDIS_DB}", endpoint)
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    farm = Farm(env, log_dir=log_dir)
    stack.callback(farm.stop)
    console.print(
        f"starting the farm: API with {args.api_workers} uvicorn workers, Celery workers "
        f"{', '.join(WORKERS)}; SeaweedFS {endpoint}"
    )
    try:
        # Migrate once, first: every uvicorn worker migrates at start-up, and on an empty database several
        # doing it at once collide (CREATE TABLE alembic_version) and take the API down.
        subprocess.run(
            [sys.executable, "-m", "enginefarm", "migrate"],
            env=farm.env,
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=120,
        )
        farm.start_api(timeout=120, workers=args.api_workers)
        token = create_token(farm.env, console)
        farm.token = token  # Farm watches the workers' heartbeats with it
        if token:
            os.environ["ENGINEFARM_TOKEN"] = token  # for anything else here that reads it
        else:
            os.environ.pop("ENGINEFARM_TOKEN", None)  # a token of some other farm would only earn 401s
        for name, targets in WORKERS.items():
            farm.start_worker(name, targets, concurrency=1, bench_targets=[])
        farm.wait_workers(list(WORKERS), timeout=180)
    except BaseException:
        dump_logs(log_dir, console)
        raise

    model_name = "load-bench"
    model_path = save_conv_net(work / "model.onnx", channels=args.channels, blocks=args.blocks, seed=7)
    with make_client(farm.url, token) as client:
        model, _ = client.upload(model_path, model_name)
        build = client.build(model["id"], TARGETS, {**sample_spec(), **NO_CHECKS})
        done = client.wait_build(build["id"], timeout=900, poll=0.2)
        failed = [f"{t['target']}: {t['state']} {t['error']}" for t in done["tasks"] if t["state"] != "succeeded"]
        if failed:
            dump_logs(log_dir, console)
            raise RuntimeError("the build failed: " + "; ".join(failed))
        # The catalog's record of every engine, by id: what each download is checked against.
        catalog = {e["id"]: e for e in client.engines(model=model_name, limit=100)["items"]}
        by_target = {e["target"]: e for e in catalog.values()}
        machines = []
        for spec in MACHINES:
            engine = by_target[spec["target"]]
            machine = dict(
                spec["machine"],
                trt_rtx_version=engine["backend_version"],
                cuda_version=engine["cuda_version"],
                driver_version=engine["driver_version"],
            )
            body = {"model": model_name, "version": model["version"], "machine": machine}
            answer = client._json(client.http.post("/v1/resolve", json=body))
            if answer["engine"]["id"] != engine["id"]:
                raise RuntimeError(
                    f"a {spec['name']} machine resolves to {answer['engine']['target']}, not {spec['target']}"
                )
            machines.append(
                {
                    "name": spec["name"],
                    "target": spec["target"],
                    "machine": machine,
                    "engine_id": engine["id"],
                    "sha256": engine["sha256"],
                    "size": engine["size"],
                }
            )

    # The download baseline: the same objects, presigned, straight from SeaweedFS.
    settings = Settings(**{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items()})
    store = S3BlobStore.from_settings(settings)
    for m in machines:
        m["presigned_url"] = store.presigned_url(engine_key(m["sha256"]), expires_seconds=24 * 3600)
        r = httpx.get(m["presigned_url"], timeout=60, trust_env=False)
        if r.status_code != 200 or hashlib.sha256(r.content).hexdigest() != m["sha256"]:
            raise RuntimeError(
                f"presigned GET of {m['target']}'s engine: HTTP {r.status_code}, "
                f"{len(r.content)} bytes, sha256 mismatch or error"
            )

    weed = [pid for pid, (pgrp, _c, _cpu) in proc_stats().items() if pid == pgrp and f"-dir={weed_dir}" in cmdline(pid)]
    meter = CpuMeter(
        {"API (uvicorn)": [farm.api.pid], "Celery workers": [p.pid for p in farm.workers.values()], "SeaweedFS": weed},
        pg_url.rsplit("/", 1)[1],
        farm.api.pid,
    )
    return {
        "farm": farm,
        "token": token,
        "model": model,
        "machines": machines,
        "meter": meter,
        "log_dir": log_dir,
        "model_bytes": model_path.stat().st_size,
        "catalog": catalog,
    }


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x == x else "-"


def print_report(res: dict, meta: dict, console) -> None:
    from rich.table import Table

    s = {p: res[p] for p in PHASES if p in res}
    farm, hz, s3 = s.get("farm"), s.get("healthz"), s.get("s3")
    t = Table(
        title=f"{meta['clients']} clients, {meta['seconds']:g} s per phase after {meta['warmup']:g} s warm-up, "
        f"{meta['api_workers']} API workers, {meta['client_procs']} client process(es) — latency in ms"
    )
    for col in ("phase", "operation", "count", "per s", "MB/s", "p50", "p90", "p99", "max", "mean"):
        t.add_column(col, justify="left" if col in ("phase", "operation") else "right")
    for phase, ops in (
        ("healthz", ["healthz"]),
        ("s3", ["s3"]),
        ("farm", ["resolve", "download", "download headers", "cycle"]),
    ):
        if phase not in s:
            continue
        for op in ops:
            o = s[phase]["ops"].get(op)
            if o is None:
                t.add_row(phase, op, "0", *["-"] * 7)
                continue
            mb = f"{o['mb_s']:.1f}" if op in ("s3", "download") else ""
            rate = "" if op == "download headers" else f"{o['per_s']:.1f}"
            t.add_row(
                phase,
                op,
                str(o["n"]),
                rate,
                mb,
                fmt_ms(o["p50"]),
                fmt_ms(o["p90"]),
                fmt_ms(o["p99"]),
                fmt_ms(o["max"]),
                fmt_ms(o["mean"]),
            )
    console.print(t)
    if farm:
        ops = farm["ops"]
        reqs = ops.get("resolve", {}).get("n", 0) + ops.get("download", {}).get("n", 0)
        console.print(
            f"farm: {reqs / meta['seconds']:.1f} requests/s (resolve + download), "
            f"{ops.get('cycle', {}).get('per_s', 0):.1f} cycles/s, {farm['mb_s']:.1f} MB/s; "
            f"sha256 verified for {farm['verified']} downloads (header, resolve answer and catalog)"
        )

    err = Table(title="errors (any non-2xx, exception or failed check), by kind")
    err.add_column("phase")
    err.add_column("kind")
    err.add_column("count", justify="right")
    for phase, data in s.items():
        if not data["errors"]:
            err.add_row(phase, "none", "0")
        for kind, n in sorted(data["errors"].items(), key=lambda kv: -kv[1]):
            err.add_row(phase, kind, str(n))
        for kind, n in sorted(data["errors_outside"].items(), key=lambda kv: -kv[1]):
            err.add_row(phase, f"{kind} (warm-up or after the window, not in the figures)", str(n))
    console.print(err)

    if farm and hz and s3:
        r = Table(title="farm / baseline (same clients, same run)")
        r.add_column("comparison")
        for col in ("p50", "p90", "p99", "max", "throughput"):
            r.add_column(col, justify="right")

        def row(label: str, a: dict, b: dict, thr: str) -> None:
            r.add_row(label, *(f"{a[k] / b[k]:.2f}" if b.get(k) else "-" for k in ("p50", "p90", "p99", "max")), thr)

        ro, do = farm["ops"].get("resolve"), farm["ops"].get("download")
        ho, so = hz["ops"].get("healthz"), s3["ops"].get("s3")
        if ro and ho:
            row("resolve / healthz", ro, ho, f"{ro['per_s'] / ho['per_s']:.2f} (req/s)")
        if do and so:
            row("download / S3 presigned GET", do, so, f"{do['mb_s'] / so['mb_s']:.2f} (MB/s)")
        cyc = farm["ops"].get("cycle")
        if cyc and ho and so:
            base = ho["mean"] + so["mean"]
            r.add_row("cycle / (healthz + S3 GET), means", "", "", "", "", f"{cyc['mean'] / base:.2f} (time)")
        console.print(r)
        console.print(
            "throughput ratios compare the farm phase's resolves (or downloads) with a phase doing only "
            "healthz (or only S3 GETs): the farm's clients split their time between the two.",
            highlight=False,
        )

    cpu = Table(
        title=f"CPU over each measured window (CPU-seconds per second; the machine has {meta['machine']['nproc']})"
    )
    cpu.add_column("phase")
    names = ["API (uvicorn)", "SeaweedFS", "PostgreSQL", "Celery workers", "clients", "rest of machine", "machine busy"]
    for n in names:
        cpu.add_column(n, justify="right")
    for col in ("DB sessions opened", "DB commits", "DB active s"):
        cpu.add_column(col, justify="right")
    for phase, data in s.items():
        c = dict(data["cpu"], clients=data["client_cpu_s"])
        c["rest of machine"] = c["machine busy"] - sum(c[n] for n in names[:5])
        pg = c.get("pg", {})
        cpu.add_row(
            phase,
            *(f"{c[n] / meta['seconds']:.2f}" for n in names),
            *(f"{pg[k]:.0f}" if k in pg else "-" for k in ("sessions", "xact_commit")),
            f"{pg['active_time'] / 1e3:.1f}" if "active_time" in pg else "-",
        )
    console.print(cpu)
    for phase, data in s.items():
        w = data["server"]
        c = w.get("db_connections_max", {})
        console.print(
            f"{phase}: API worker processes seen {w.get('api_processes')} (of {meta['api_workers']}; more "
            f"means uvicorn replaced a worker); scratch-DB connections at most {c.get('all', 0)} (idle in "
            f"transaction {c.get('idle in transaction', 0)}, active {c.get('active', 0)}, idle "
            f"{c.get('idle', 0)}), sampled {w.get('samples')} times",
            highlight=False,
        )
    console.print(
        "rest of machine: busy CPU of every process not listed (other PostgreSQL databases, other "
        "programs, the kernel); DB columns: pg_stat_database of the scratch database over the window.",
        highlight=False,
    )
    m = meta["machine"]
    console.print(
        f"machine: nproc {m['nproc']}, {m['cpu']}, {m['mem_gib']} GiB, {m['os']}, Python {m['python']}; "
        f"CPUs available to the client processes: {m['client_cpus']}; load average before "
        f"{meta['load_before']}, after {meta.get('load_after')}",
        highlight=False,
    )
    console.print(
        "engines: "
        + ", ".join(f"{e['target']} {e['size'] / 1e6:.2f} MB" for e in meta["engines"])
        + f"; model {meta['model_bytes'] / 1e6:.2f} MB; auth: {meta['auth']}",
        highlight=False,
    )
    if meta.get("log_problems"):
        console.print("farm logs, WARNING/ERROR lines and tracebacks (count):", highlight=False)
        for name, kinds in meta["log_problems"].items():
            for line, n in kinds.items():
                console.print(f"  {name}: {n} x {line}", highlight=False)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=60, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=5, help="seconds per phase run before the clock starts")
    parser.add_argument("--api-workers", type=int, default=2, help="uvicorn worker processes of the API")
    parser.add_argument("--client-procs", type=int, default=1, help="client processes the clients are spread over")
    parser.add_argument("--timeout", type=float, default=120, help="per-request timeout (s)")
    parser.add_argument("--channels", type=int, default=256, help="conv_net channels (256 x 4 blocks: ~7 MB engines)")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--json", type=Path, help="write the figures (and every setting) to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (farm logs)")
    parser.add_argument(
        "--smoke", action="store_true", help="4 clients for 2 s per phase, small engines: checks that it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.seconds, args.warmup, args.channels, args.blocks = 4, 2.0, 0.5, 16, 1

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)

    def _terminate(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)

    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "clients": args.clients,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "api_workers": args.api_workers,
        "client_procs": args.client_procs,
        "machine": machine_info(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }
    m = meta["machine"]
    console.print(
        f"nproc {m['nproc']} ({m['cpu']}); CPUs for the client processes: {m['client_cpus']}; "
        f"load average {meta['load_before']}",
        highlight=False,
    )
    work = Path(tempfile.mkdtemp(prefix="efload-"))
    results: dict = {}
    try:
        with ExitStack() as stack:
            env = setup_farm(args, work, stack, console)
            meta["auth"] = "Bearer token (scope build)" if env["token"] else "none (token create failed)"
            meta["engines"] = [
                {"target": e["target"], "size": e["size"], "sha256": e["sha256"]} for e in env["catalog"].values()
            ]
            meta["model_bytes"] = env["model_bytes"]
            auth = {"Authorization": f"Bearer {env['token']}"} if env["token"] else {}
            cfg = {
                "url": env["farm"].url,
                "headers": auth,
                "model": env["model"]["name"],
                "version": env["model"]["version"],
                "machines": env["machines"],
                "clients": args.clients,
                "seconds": args.seconds,
                "warmup": args.warmup,
                "timeout": args.timeout,
            }
            try:
                for phase in [p for p in PHASES if p in args.phases]:
                    console.print(
                        f"phase {phase}: {args.clients} clients, {args.warmup:g} s warm-up + {args.seconds:g} s",
                        highlight=False,
                    )
                    results[phase] = summarize(run_phase(phase, cfg, args.client_procs, env["meter"]))
                    o = results[phase]
                    rates = ", ".join(f"{k} {v['per_s']:.1f}/s" for k, v in o["ops"].items() if k != "download headers")
                    console.print(f"  {rates}; errors {o['error_total']}", highlight=False)
            finally:
                meta["log_problems"] = log_problems(env["log_dir"])
    finally:
        if args.keep:
            console.print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    meta["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print_report(results, meta, console)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
        console.print(f"wrote {args.json}")
    return 1 if any(r["error_total"] for r in results.values()) else 0  # errors in a window: exit status 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(
            "interrupted: the farm, SeaweedFS, the client processes and the scratch database are stopped",
            file=sys.stderr,
        )
        sys.exit(130)
