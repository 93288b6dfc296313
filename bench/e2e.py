"""End-to-end benchmark: how much does the farm add on top of the builders and the byte moving?

For the same model and targets, one run measures

  a  the builders alone: ``worker.pipeline.engine_from_model`` for each target, sequentially,
     in this process, from a model file in a tmpfs directory (``--direct-on disk``: in the directory on the
     disk the farm's data directory is on, where the farm's worker writes its plans), keeping freed memory as
     the farm's workers do (``worker/process/malloc.py``; ``--direct-malloc default``: glibc's own thresholds);
  b  moving the bytes alone: the model and every engine put into a blob store of the mode's kind
     (LocalBlobStore for embedded, S3BlobStore on SeaweedFS for distributed) with its own client,
     plus the one get of the model that a worker makes;
  c  the farm: wall time from the start of the upload until every task of the build has
     succeeded (engines stored and catalogued), through the real API and Celery worker processes.

and prints per mode the farm/floor ratio c / (a + b), the fixed cost per task (c - a - b) / tasks,
and the tasks' queued→running times. The farm is started, and warmed with one small build, before
any clock runs. Each repeat uses a new model seed, so the farm's dedup never short-circuits a build.
Between repeats, off the clocks, it waits until the last build's benchmarks are done ("settle"), so
that neither a nor c shares the CPU with a benchmark of the repeat before; ``--no-settle`` starts the
next repeat at once instead (a benchmark may then still be running while a and c are measured).

    python bench/e2e.py --mode both            # embedded and distributed, 3 repeats each
    python bench/e2e.py --mode embedded --repeat 5 --json /tmp/e2e.json
    python bench/e2e.py --smoke                # embedded, 1 worker, 1 small build: a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from enginefarm.client import Client  # noqa: E402
from enginefarm.core.config import Settings  # noqa: E402
from enginefarm.core.domain import Target  # noqa: E402
from enginefarm.core.hashing import sha256_file  # noqa: E402
from enginefarm.core.spec import BuildSpec  # noqa: E402
from enginefarm.graph.samples import sample_spec, save_conv_net  # noqa: E402
from server import localservers  # noqa: E402
from server.embedded import Farm, embedded_env, issue_token  # noqa: E402
from storage.blobs import engine_key, model_key  # noqa: E402
from storage.blobs.base import BlobStore  # noqa: E402
from worker.backends import BuildLog  # noqa: E402
from worker.pipeline import engine_from_model  # noqa: E402
from worker.process.malloc import keep_freed_memory  # noqa: E402

TARGETS = [
    "tensorrt-rtx/sm80",
    "tensorrt-rtx/sm86",
    "tensorrt-rtx/sm89",
    "tensorrt-rtx/sm120",
    "onnxruntime/cpu-x86_64",
]
# The two-worker configuration splits the targets as the test suite does.
WORKER_A = ["tensorrt-rtx/sm80", "tensorrt-rtx/sm86"]
WORKER_B = ["tensorrt-rtx/sm89", "tensorrt-rtx/sm120", "onnxruntime/cpu-x86_64"]
CONFIGS = {"1 worker": {"bench-solo": TARGETS}, "2 workers": {"bench-a": WORKER_A, "bench-b": WORKER_B}}
HEADLINE = "1 worker"
REDIS_DB = 12
TMPFS = Path("/dev/shm") if Path("/dev/shm").is_dir() else None

console = Console(width=None if sys.stdout.isatty() else 180)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# ------------------------------------------------------------------------------ a: the builders alone


def run_builders(model: Path, spec: BuildSpec, scratch_root: Path) -> dict:
    """Each target once, sequentially, in this process. Returns per-target wall and builder seconds."""
    out: dict = {"wall": {}, "build": {}, "engines": {}}
    for text in TARGETS:
        scratch = scratch_root / text.replace("/", "_")
        scratch.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        built = engine_from_model(model, spec, Target.parse(text), None, scratch, BuildLog())
        out["wall"][text] = time.perf_counter() - started  # builder + sha256 of the engine
        out["build"][text] = built.seconds  # the builder call alone (what the farm records as build_seconds)
        out["engines"][text] = (built.path, built.descriptor.sha256, built.descriptor.size)
    return out


# ------------------------------------------------------------------------------ b: moving the bytes alone


def move_bytes(store: BlobStore, model: Path, model_sha: str, engines: dict, get_dir: Path) -> dict:
    """Put the model and each engine (as the API and the worker do), then get the model once (as a worker does)."""
    puts = {}
    started = time.perf_counter()
    store.put_file(model_key(model_sha), model, model_sha)
    puts["model"] = time.perf_counter() - started
    for text, (path, sha, _size) in engines.items():
        started = time.perf_counter()
        store.put_file(engine_key(sha), path, sha)
        puts[text] = time.perf_counter() - started
    started = time.perf_counter()
    store.get_file(model_key(model_sha), get_dir / f"model-{model_sha[:12]}.onnx")
    get_s = time.perf_counter() - started
    return {"puts": puts, "put_s": sum(puts.values()), "get_s": get_s}


# ------------------------------------------------------------------------------ c: the farm


def run_farm(client: Client, model: Path, name: str, spec: dict, poll: float) -> dict:
    """Upload → build → every task final, timed on this side; the catalog's timestamps for the breakdown."""
    t0_wall, t0 = time.time(), time.perf_counter()
    m, created = client.upload(model, name)
    t_upload = time.perf_counter()
    if not created:
        raise RuntimeError(f"model {name} was already in the catalog: the farm would dedup its builds")
    build = client.build(m["id"], TARGETS, spec)
    t_submit = time.perf_counter()
    done = client.wait_build(build["id"], timeout=1800, poll=poll)
    t_end = time.perf_counter()
    t_end_wall = t0_wall + (t_end - t0)
    model_id = m["id"]
    bad = [t for t in done["tasks"] if t["state"] != "succeeded" or t["reused"]]
    if bad:
        raise RuntimeError(
            f"build {build['id']}: tasks not freshly built: "
            + "; ".join(f"{t['target']} {t['state']} reused={t['reused']} {t['error']}" for t in bad)
        )
    tasks = []
    for t in done["tasks"]:
        engine = client.get(f"/v1/engines/{t['engine_id']}")
        tasks.append(
            {
                "target": t["target"],
                "worker": t["worker_id"],
                "queued": ts(t["queued_at"]),
                "started": ts(t["started_at"]),
                "finished": ts(t["finished_at"]),
                "wait_s": t["wait_seconds"],
                "run_s": t["run_seconds"],
                "build_s": engine["build_seconds"],
            }
        )
    # Per worker, the idle time between one task's finish and its next task's start: pure dispatch latency.
    gaps, first_dispatch = [], []
    for worker in {t["worker"] for t in tasks}:
        mine = sorted((t for t in tasks if t["worker"] == worker), key=lambda t: t["started"])
        first_dispatch.append(mine[0]["started"] - mine[0]["queued"])
        gaps += [b["started"] - a["finished"] for a, b in zip(mine, mine[1:])]
    return {
        "model_id": model_id,
        "wall_s": t_end - t0,
        "upload_s": t_upload - t0,
        "submit_s": t_submit - t_upload,
        "first_dispatch_s": min(first_dispatch),
        "gaps": gaps,
        "gap_sum_s": sum(gaps),
        "run_sum_s": sum(t["run_s"] for t in tasks),
        "build_sum_s": sum(t["build_s"] for t in tasks),
        "task_overhead_s": sum(t["run_s"] - t["build_s"] for t in tasks),
        "tail_s": t_end_wall - max(t["finished"] for t in tasks),
        "tasks": tasks,
    }


def start_farm(env: dict, workers: dict[str, list[str]], log_dir: Path) -> Farm:
    settings = Settings(
        **{k.removeprefix("ENGINEFARM_").lower(): v for k, v in env.items() if k.startswith("ENGINEFARM_")}
    )
    farm = Farm(env, log_dir=log_dir, token=issue_token(settings, "bench-e2e", ["admin"]))
    try:
        farm.start_api()
        for name, targets in workers.items():
            farm.start_worker(name, targets, concurrency=1)
        farm.wait_workers(list(workers))
    except BaseException:
        farm.stop()
        dump_logs(log_dir)
        raise
    return farm


def dump_logs(log_dir: Path) -> None:
    for log in sorted(log_dir.glob("*.log")):
        tail = log.read_text(errors="replace")[-3000:]
        if "Traceback" in tail or "Error" in tail:
            console.print(f"[red]--- {log} ---[/red]\n{tail}", highlight=False)


def warm_farm(client: Client, work: Path, tag: str, seed: int, spec: dict) -> int:
    """One small build for every target: pool children import the builders, connections open. Returns the
    model's id."""
    small = save_conv_net(work / f"warm-{tag}.onnx", channels=16, blocks=2, seed=seed)
    m, _ = client.upload(small, f"warm-{tag}")
    build = client.build(m["id"], TARGETS, spec)
    done = client.wait_build(build["id"], timeout=600, poll=0.05)
    failed = [f"{t['target']}: {t['error']}" for t in done["tasks"] if t["state"] != "succeeded"]
    if failed:
        raise RuntimeError("warm-up build failed: " + "; ".join(failed))
    return m["id"]


def settle(client: Client, model_id: int, enabled: bool) -> float:
    """Wait (off the clocks) until the model's benchmarks are done; returns the seconds waited."""
    started = time.perf_counter()
    if enabled:
        client.wait_checks(model_id, timeout=900, poll=0.1)
    return time.perf_counter() - started


# ------------------------------------------------------------------------------ one mode


def run_mode(mode: str, args, work: Path) -> dict:
    """All configurations of one mode; per repeat a fresh model measured by a, b and c."""
    spec_payload = sample_spec()
    spec = BuildSpec(**spec_payload)
    results: dict = {"mode": mode, "configs": {}}
    with ExitStack() as stack:
        data = work / mode / "farm-data"
        if mode == "embedded":
            env = embedded_env(data)
            from storage.blobs.local import LocalBlobStore

            store: BlobStore = LocalBlobStore(work / mode / "bench-blobs")  # same file system as the farm's blobs
        else:
            import redis

            from storage.blobs.s3 import S3BlobStore

            endpoint = stack.enter_context(localservers.seaweedfs(work / mode / "seaweedfs"))
            pg_url = stack.enter_context(localservers.scratch_postgres("enginefarm_bench"))
            redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB).flushdb()
            env = localservers.distributed_env(data, pg_url, f"redis://127.0.0.1:6379/{REDIS_DB}", endpoint)
            # b's own client and its own bucket: content-addressed puts must not find the farm's blobs.
            store = S3BlobStore.from_settings(
                Settings(
                    data_dir=work / mode / "bench",
                    blob_store="s3",
                    s3_endpoint_url=endpoint,
                    s3_bucket=f"efbench-b-{uuid.uuid4().hex[:8]}",
                    s3_access_key=localservers.S3_KEY,
                    s3_secret_key=localservers.S3_SECRET,
                )
            )
        get_dir = work / mode / "bench-get"
        get_dir.mkdir(parents=True, exist_ok=True)
        # Warm the in-process builders and the bench store client too (imports, connections).
        warm = save_conv_net(work / f"warm-{mode}.onnx", channels=16, blocks=2, seed=99)
        warm_built = run_builders(warm, spec, work / mode / "warm-scratch")
        move_bytes(store, warm, sha256_file(warm), warm_built["engines"], get_dir)

        for ci, (config, workers) in enumerate(CONFIGS.items()):
            if args.workers and len(workers) != args.workers:
                continue
            log_dir = work / mode / f"logs-{ci}"
            log_dir.mkdir(parents=True, exist_ok=True)
            console.print(f"[bold]{mode}[/bold], {config}: starting the farm ({', '.join(workers)})")
            farm = start_farm(env, workers, log_dir)
            runs = []
            try:
                with Client(farm.url, timeout=300, token=farm.token) as client:
                    settle(client, warm_farm(client, work, f"{mode}-{ci}", 10_000 + ci, spec_payload), args.settle)
                    for rep in range(args.repeat):
                        seed = 1000 * (ci + 1) + rep
                        direct_dir = TMPFS if args.direct_on == "tmpfs" else work
                        model_dir = Path(tempfile.mkdtemp(dir=direct_dir, prefix="efbench-model-"))
                        try:
                            model = save_conv_net(
                                model_dir / "model.onnx", channels=args.channels, blocks=args.blocks, seed=seed
                            )
                            model_sha = sha256_file(model)
                            a = run_builders(model, spec, model_dir / "scratch")
                            b = move_bytes(store, model, model_sha, a["engines"], get_dir)
                            c = run_farm(
                                client, model, f"bench-{mode}-{seed}-{uuid.uuid4().hex[:6]}", spec_payload, args.poll
                            )
                            c["settle_s"] = settle(client, c["model_id"], args.settle)
                            a_s = sum(a["wall"].values())
                            b_s = b["put_s"] + b["get_s"]
                            run = {
                                "seed": seed,
                                "model_bytes": model.stat().st_size,
                                "engine_bytes": {t: e[2] for t, e in a["engines"].items()},
                                "a": {"per_target_s": a["wall"], "builder_s": a["build"], "sum_s": a_s},
                                "b": {"puts_s": b["puts"], "put_s": b["put_s"], "get_s": b["get_s"], "sum_s": b_s},
                                "c": c,
                                "ratio": c["wall_s"] / (a_s + b_s),
                                "fixed_per_task_s": (c["wall_s"] - a_s - b_s) / len(TARGETS),
                                "load1": os.getloadavg()[0],
                            }
                            runs.append(run)
                            console.print(
                                f"  repeat {rep + 1}/{args.repeat} (seed {seed}): a={a_s:.2f}s b={b_s:.2f}s "
                                f"c={c['wall_s']:.2f}s  c/(a+b)={run['ratio']:.2f}  "
                                f"fixed/task={run['fixed_per_task_s']:.3f}s  "
                                f"settle={c['settle_s']:.2f}s  load={run['load1']:.2f}"
                            )
                        finally:
                            shutil.rmtree(model_dir, ignore_errors=True)
                            for f in get_dir.glob("*"):
                                f.unlink()
            except BaseException:
                dump_logs(log_dir)
                raise
            finally:
                farm.stop()
            results["configs"][config] = {"workers": workers, "runs": runs}
    return results


# ------------------------------------------------------------------------------ report


def summarize(results: list[dict]) -> dict:
    summary = {}
    for res in results:
        for config, data in res["configs"].items():
            runs = data["runs"]
            waits = [t["wait_s"] for r in runs for t in r["c"]["tasks"]]
            gaps = [g for r in runs for g in r["c"]["gaps"]]
            summary[f"{res['mode']} / {config}"] = {
                "a_s": med([r["a"]["sum_s"] for r in runs]),
                "b_put_s": med([r["b"]["put_s"] for r in runs]),
                "b_get_s": med([r["b"]["get_s"] for r in runs]),
                "b_s": med([r["b"]["sum_s"] for r in runs]),
                "a_plus_b_s": med([r["a"]["sum_s"] + r["b"]["sum_s"] for r in runs]),
                "c_s": med([r["c"]["wall_s"] for r in runs]),
                "c_runs_s": [r["c"]["wall_s"] for r in runs],
                "ratio": med([r["ratio"] for r in runs]),
                "ratios": [r["ratio"] for r in runs],
                "fixed_per_task_s": med([r["fixed_per_task_s"] for r in runs]),
                "fixed_per_task_runs_s": [r["fixed_per_task_s"] for r in runs],
                "wait_s": {"min": min(waits), "median": med(waits), "max": max(waits)} if waits else None,
                "gap_s": {"min": min(gaps), "median": med(gaps), "max": max(gaps)} if gaps else None,
                "breakdown": {
                    k: med([r["c"][k] for r in runs])
                    for k in (
                        "upload_s",
                        "submit_s",
                        "first_dispatch_s",
                        "build_sum_s",
                        "task_overhead_s",
                        "gap_sum_s",
                        "tail_s",
                    )
                },
                "per_target": {
                    t: {
                        "alone_s": med([r["a"]["per_target_s"][t] for r in runs]),
                        "alone_builder_s": med([r["a"]["builder_s"][t] for r in runs]),
                        "farm_build_s": med(
                            [next(x["build_s"] for x in r["c"]["tasks"] if x["target"] == t) for r in runs]
                        ),
                        "farm_run_s": med(
                            [next(x["run_s"] for x in r["c"]["tasks"] if x["target"] == t) for r in runs]
                        ),
                    }
                    for t in TARGETS
                },
            }
    return summary


def print_report(summary: dict, meta: dict) -> None:
    main = Table(
        title=f"enginefarm end to end: {meta['model']}, {len(TARGETS)} targets, median of {meta['repeat']} (seconds)"
    )
    for col in (
        "mode / config",
        "a builders",
        "b bytes (put+get)",
        "a+b",
        "c farm",
        "c-(a+b)",
        "c/(a+b)",
        "c per repeat",
        "speed-up",
    ):
        main.add_column(col, justify="right" if col != "mode / config" else "left")
    for key, s in summary.items():
        mode = key.split(" / ")[0]
        solo = summary.get(f"{mode} / {HEADLINE}")
        speedup = f"{solo['c_s'] / s['c_s']:.2f}x" if solo else ""
        main.add_row(
            key,
            f"{s['a_s']:.2f}",
            f"{s['b_s']:.2f} ({s['b_put_s']:.2f}+{s['b_get_s']:.2f})",
            f"{s['a_plus_b_s']:.2f}",
            f"{s['c_s']:.2f}",
            f"{s['c_s'] - s['a_plus_b_s']:.2f}",
            f"{s['ratio']:.2f}",
            " ".join(f"{x:.2f}" for x in s["c_runs_s"]),
            speedup,
        )
    console.print(main)

    where = Table(title="where c goes (median per build, seconds; for 2 workers the sums overlap in time)")
    cols = [
        ("upload", "upload_s"),
        ("submit", "submit_s"),
        ("1st dispatch", "first_dispatch_s"),
        ("Σ builder", "build_sum_s"),
        ("Σ in-task overhead", "task_overhead_s"),
        ("Σ idle gaps", "gap_sum_s"),
        ("wait tail", "tail_s"),
    ]
    where.add_column("mode / config")
    for label, _ in cols:
        where.add_column(label, justify="right")
    where.add_column("queued→running min/med/max", justify="right")
    where.add_column("idle gap min/med/max", justify="right")
    for key, s in summary.items():
        w, g = s["wait_s"], s["gap_s"]
        where.add_row(
            key,
            *(f"{s['breakdown'][k]:.2f}" for _, k in cols),
            f"{w['min']:.2f}/{w['median']:.2f}/{w['max']:.2f}" if w else "",
            f"{g['min']:.2f}/{g['median']:.2f}/{g['max']:.2f}" if g else "",
        )
    console.print(where)

    per = Table(title="per target (median, seconds): builder alone vs the farm's task")
    per.add_column("mode / config")
    per.add_column("target")
    for col in ("alone (build+sha)", "alone builder", "farm builder", "farm run (claim→catalogued)"):
        per.add_column(col, justify="right")
    for key, s in summary.items():
        for t, p in s["per_target"].items():
            per.add_row(
                key,
                t,
                f"{p['alone_s']:.2f}",
                f"{p['alone_builder_s']:.2f}",
                f"{p['farm_build_s']:.2f}",
                f"{p['farm_run_s']:.2f}",
            )
    console.print(per)
    for key, s in summary.items():
        w = s["wait_s"]
        console.print(
            f"[bold]{key}: farm/floor c/(a+b) = {s['ratio']:.2f}[/bold] (goal <= 1.2; per repeat "
            + ", ".join(f"{r:.2f}" for r in s["ratios"])
            + f"); [bold]fixed cost per task "
            f"(c-a-b)/{len(TARGETS)} = {s['fixed_per_task_s']:.3f} s[/bold] (goal <= 0.1; per repeat "
            + ", ".join(f"{r:.3f}" for r in s["fixed_per_task_runs_s"])
            + "); queued→running "
            + (f"min/median/max {w['min']:.2f}/{w['median']:.2f}/{w['max']:.2f} s" if w else "n/a"),
            highlight=False,
        )
    console.print(f"load average before {meta['load_before']}, after {meta['load_after']}; {meta['machine']}")


def machine_info() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem = f"{mem_kb / (1 << 20):.1f} GiB RAM"
    except (OSError, StopIteration):
        mem = "unknown RAM"
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["embedded", "distributed", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=3, help="builds per configuration, each with a new model seed")
    parser.add_argument("--channels", type=int, default=384, help="conv_net channels (384 x 6 blocks: ~27 MB)")
    parser.add_argument("--blocks", type=int, default=6, help="conv_net blocks")
    parser.add_argument(
        "--poll", type=float, default=0.05, help="wait_build's poll interval where a farm does not wait (it long-polls)"
    )
    parser.add_argument(
        "--workers", type=int, choices=[1, 2], help="run only the 1-worker or the 2-worker configuration"
    )
    parser.add_argument(
        "--direct-on",
        choices=["tmpfs", "disk"],
        default="tmpfs",
        help="where a's builders read the model and write their plans: a tmpfs (the strictest baseline) or the "
        "disk the farm's data directory is on (where trtexec --saveEngine would write)",
    )
    parser.add_argument(
        "--direct-malloc",
        choices=["kept", "default"],
        default="kept",
        help="a's process keeps freed memory as the farm's workers do (ENGINEFARM_WORKER_MALLOC_KEEP_MIB; the "
        "strictest baseline), or uses glibc's own thresholds (a plain Python process calling the builder)",
    )
    parser.add_argument("--json", type=Path, help="write every measurement to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (farm logs, data)")
    parser.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="start each repeat at once, while the last build's benchmarks may still run",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="embedded, one worker, one small build: checks that it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.mode, args.repeat, args.channels, args.blocks, args.workers = "embedded", 1, 16, 1, 1

    if args.direct_malloc == "kept":  # a's builders fault no fresh pages either (worker/process/malloc.py)
        keep_freed_memory(Settings().worker_malloc_keep_mib)
    modes = ["embedded", "distributed"] if args.mode == "both" else [args.mode]
    work = Path(tempfile.mkdtemp(prefix="efbench-"))
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "settle": args.settle,
        "model": f"conv_net(channels={args.channels}, blocks={args.blocks})",
        "repeat": args.repeat,
        "targets": TARGETS,
        "poll_s": args.poll,
        "direct_on": args.direct_on,
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "work_dir": str(work),
    }
    console.print(f"work dir {work}; {meta['machine']}; load average {meta['load_before']}")
    try:
        results = [run_mode(mode, args, work) for mode in modes]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    meta["load_after"] = [round(x, 2) for x in os.getloadavg()]
    summary = summarize(results)
    print_report(summary, meta)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=2, default=str))
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
