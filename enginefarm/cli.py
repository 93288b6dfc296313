"""The ``enginefarm`` command line (typer + rich)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from enginefarm.ci import ci_command
from enginefarm.config import get_settings
from enginefarm.compat import ACCEPT
from enginefarm.domain import Precision, parse_val_ranges, shape_request, spec_shapes_from_trtexec
from enginefarm.report import profiles_label

app = typer.Typer(help="enginefarm: build TensorRT engines for every GPU, fetch the one that runs here.",
                  no_args_is_help=True, pretty_exceptions_show_locals=False)
ls_app = typer.Typer(help="List what the catalog holds.", no_args_is_help=True)
app.add_typer(ls_app, name="ls")
export_app = typer.Typer(help="Export a catalogued model for a serving system.", no_args_is_help=True)
app.add_typer(export_app, name="export")
token_app = typer.Typer(help="API tokens (works on the catalog database directly: run it where the farm's settings are).",
                        no_args_is_help=True)
app.add_typer(token_app, name="token")
# Wide tables when piped (CI logs, the demo's output), the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _client(api: str | None):
    from enginefarm.client import Client

    return Client(api)


@contextmanager
def _farm(api: str | None):
    """A client whose failures end the command with one line a user can act on, never a traceback."""
    try:
        with _client(api) as c:
            yield c
    except Exception as exc:  # noqa: BLE001 - every failure is printed, then the command exits 1
        _fail(exc)


def _fail(exc: Exception) -> None:
    import httpx

    if isinstance(exc, httpx.TransportError):
        try:  # where the request went: --api, else ENGINEFARM_API_URL, else the default
            url = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        except RuntimeError:  # an error raised before any request was made
            url = os.environ.get("ENGINEFARM_API_URL") or "http://127.0.0.1:8321"
        err.print(f"[red]error:[/red] cannot reach the farm at {url} ({exc}); it is looked for at --api or "
                  f"ENGINEFARM_API_URL; `enginefarm up` starts one")
        raise typer.Exit(1)
    err.print(f"[red]error:[/red] {getattr(exc, 'message', exc)}")
    for problem in getattr(exc, "problems", None) or []:
        where = ".".join(str(p) for p in problem.get("loc", [])) or problem.get("target", "")
        err.print(f"  - {where}: {problem.get('msg') or problem.get('reason')}")
    raise typer.Exit(1)


API_OPT = typer.Option(None, "--api", envvar="ENGINEFARM_API_URL", help="farm URL (default http://127.0.0.1:8321)")
QUEUE_OPT = typer.Option(False, "--queue-without-worker",
                         help="queue targets no live worker serves now, to wait for one (default: refused)")


@app.callback()
def _global(token: Optional[str] = typer.Option(None, "--token", envvar="ENGINEFARM_TOKEN", show_envvar=True,
                                                help="API token for the farm's REST API")) -> None:
    if token:  # the client reads it from the environment
        os.environ["ENGINEFARM_TOKEN"] = token


# ------------------------------------------------------------------------------ tokens


@token_app.command("create")
def token_create(scope: list[str] = typer.Option(..., "--scope", help="read, build or admin (repeatable)"),
                 name: str = typer.Option(..., help="who or what uses it"),
                 expires_days: Optional[float] = typer.Option(None, help="valid for this many days (default: until revoked)"),
                 project: Optional[str] = typer.Option(None, help="limit it to one project's models (default: the "
                                                                  "whole farm)")) -> None:
    """Make an API token. It is printed once, alone on stdout, and only its hash is stored."""
    from enginefarm.embedded import prepare
    from enginefarm.errors import EnginefarmError
    from storage.db import session_scope
    from storage.tokens import create_token, lifetime

    settings = get_settings()
    prepare(settings)
    try:
        expires = lifetime(expires_days)
        with session_scope(settings) as session:
            row, token = create_token(session, name, scope, expires, project)
    except EnginefarmError as exc:
        _fail(exc)
    where = f" in project {row.project}" if row.project else ""
    err.print(f"token {row.id} '{row.name}' with scope {', '.join(row.scopes)}{where}; keep it now, it cannot be shown "
              f"again:")
    print(token)


@token_app.command("list")
def token_list() -> None:
    """Tokens with their scopes and state (never the tokens themselves)."""
    from storage.db import session_scope
    from storage.tokens import list_tokens, token_state

    table = Table(title="API tokens")
    for col in ("id", "name", "starts with", "scopes", "project", "state", "created", "last used"):
        table.add_column(col)
    with session_scope(get_settings()) as session:
        for r in list_tokens(session):
            table.add_row(str(r.id), r.name, r.prefix + "…", ", ".join(r.scopes), r.project or "(all)", token_state(r),
                          f"{r.created_at:%Y-%m-%d %H:%M}", f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "-")
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from enginefarm.errors import EnginefarmError
    from storage.db import session_scope
    from storage.tokens import revoke_token

    try:
        with session_scope(get_settings()) as session:
            row = revoke_token(session, token_id)
    except EnginefarmError as exc:
        _fail(exc)
    console.print(f"token {row.id} '{row.name}' is revoked")


# ------------------------------------------------------------------------------ services


@app.command()
def api(host: str = "127.0.0.1", port: int = 8321, workers: int = typer.Option(1, help="uvicorn worker processes")) -> None:
    """Run the REST API (OpenAPI at /docs)."""
    import uvicorn

    from enginefarm.config import KEEP_ALIVE_SECONDS

    uvicorn.run("api.main:app", host=host, port=port, workers=workers, log_level="info",
                timeout_keep_alive=KEEP_ALIVE_SECONDS)


@app.command()
def worker(
    probe: bool = typer.Option(False, "--probe", help="print what this machine can build, then exit"),
    targets: Optional[str] = typer.Option(None, help="comma-separated targets to serve instead of the probed ones"),
    bench_targets: Optional[str] = typer.Option(
        None, "--bench-targets", help="comma-separated targets whose engines to benchmark instead of the probed ones "
                                      "(engines this machine's GPU or CPU runs), or 'none'"),
    name: Optional[str] = typer.Option(None, help="worker name (default: the hostname)"),
    concurrency: int = typer.Option(None, help="parallel builds (default ENGINEFARM_WORKER_CONCURRENCY or 1)"),
    pool: str = typer.Option("prefork", help="Celery pool: prefork isolates builds in child processes"),
    loglevel: str = "info",
) -> None:
    """Probe this machine, then consume the build queues of exactly the targets it can build and the
    benchmark queues of exactly the targets whose engines it can run."""
    from worker.probe import benchmark_targets, buildable_targets, probe_machine, probe_report

    settings = get_settings()
    machine = probe_machine()
    if probe:
        console.print_json(json.dumps(machine.to_dict()))
        for line in probe_report(machine):
            console.print(line, highlight=False)
        return
    from enginefarm.domain import Target
    from enginefarm.workerid import check_worker_name

    def parse(text: str) -> list[Target]:
        return [] if text.strip() == "none" else [Target.parse(t) for t in text.split(",") if t.strip()]

    chosen_text = targets or settings.worker_targets
    bench_text = bench_targets or settings.worker_bench_targets
    try:
        chosen = parse(chosen_text) if chosen_text else buildable_targets(machine)
        bench = parse(bench_text) if bench_text else benchmark_targets(machine)
        name = check_worker_name(name or socket.gethostname())
    except ValueError as exc:
        _fail(exc)
    if not chosen and not bench:
        _fail(RuntimeError("this machine can build no target and run no engine; see `enginefarm worker --probe`"))
    _run_worker(settings, machine, chosen, bench, name, concurrency or settings.worker_concurrency, pool, loglevel)


def _run_worker(settings, machine, targets, bench, name, concurrency, pool, loglevel) -> None:
    from celery.signals import worker_ready, worker_shutdown

    from enginefarm.embedded import prepare
    from enginefarm.workerid import new_worker_id
    from worker.heartbeat import Heartbeat

    # New at every start: the tasks a crashed predecessor of the same name left running are requeued once its
    # id falls silent, instead of being kept "running" by this process's heartbeats.
    worker_id = new_worker_id(name)
    os.environ["ENGINEFARM_WORKER_ID"] = worker_id  # pool children inherit it
    for attempt in range(5):  # several processes may migrate a fresh catalog at once
        try:
            prepare(settings)
            break
        except Exception:
            if attempt == 4:
                raise
            time.sleep(1 + attempt)
    from worker.celery_app import app as celery_app

    from enginefarm.domain import QUANTIZE_QUEUE, Backend

    heartbeat = Heartbeat(settings, worker_id, [str(t) for t in targets], machine.to_dict(), [str(t) for t in bench])
    worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    worker_shutdown.connect(lambda **_: heartbeat.stop(), weak=False)
    queues = [t.queue for t in targets] + [t.bench_queue for t in bench]
    if any(t.backend is Backend.ONNXRUNTIME for t in targets):  # ONNX Runtime CPU workers quantize
        queues.append(QUANTIZE_QUEUE)
    err.print(f"worker {worker_id} builds: {', '.join(str(t) for t in targets) or 'nothing'}; "
              f"benchmarks: {', '.join(str(t) for t in bench) or 'nothing'}")
    celery_app.worker_main([
        "worker", "-Q", ",".join(queues), "--concurrency", str(concurrency), "--pool", pool,
        "--loglevel", loglevel, "-n", worker_id, "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])


@app.command()
def reconcile(loop: bool = typer.Option(False, "--loop", help="keep running every ENGINEFARM_RECONCILE_SECONDS")) -> None:
    """Requeue tasks of workers that died and republish queued tasks whose broker message was lost (the API
    also does this in the background)."""
    from worker.reconcile import reconcile_once

    settings = get_settings()
    while True:
        counts = reconcile_once(settings)
        console.print(f"requeued {counts['requeued']} task(s) of dead workers, republished {counts['republished']} "
                      f"lost message(s)")
        if not loop:
            return
        time.sleep(settings.reconcile_seconds or 15)


@app.command()
def gc(grace_hours: Optional[float] = typer.Option(None, help="keep unreferenced blobs younger than this "
                                                                 "(default ENGINEFARM_GC_GRACE_SECONDS, 24 h)"),
       dry_run: bool = typer.Option(False, "--dry-run", help="report what would go, delete nothing"),
       as_json: bool = typer.Option(False, "--json"),
       allow_empty_catalog: bool = typer.Option(False, help="sweep even though no row references any blob")) -> None:
    """Delete blobs that no catalog row references, once older than the grace period (the API's background
    sweep does the same every ENGINEFARM_GC_INTERVAL_SECONDS). A referenced blob is never deleted."""
    from storage.gc import collect_garbage

    settings = get_settings()
    grace = grace_hours * 3600 if grace_hours is not None else settings.gc_grace_seconds
    try:
        report = collect_garbage(settings, grace_seconds=grace, dry_run=dry_run, allow_empty_catalog=allow_empty_catalog)
    except Exception as exc:  # GcRefused, or the store or catalog unreachable
        _fail(exc)
    if as_json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(1)


@app.command()
def migrate() -> None:
    """Create or upgrade the catalog's tables (the API also does this at start)."""
    from enginefarm.embedded import prepare

    prepare(get_settings())
    console.print("catalog is at the newest revision")


@app.command()
def up(port: int = 8321, workers: int = typer.Option(1, help="worker processes")) -> None:
    """Run an all-in-one farm (API + workers) with no external services, until Ctrl-C. A worker or API process
    that dies is started again; when this command ends, however it ends, they end with it."""
    import logging

    from enginefarm.embedded import Farm, issue_token, stop_on_sigterm

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    settings = get_settings()
    token = issue_token(settings, f"enginefarm up on {socket.gethostname()}", ["admin"])
    # Short enough that the workers and the API are stopped before a service manager's SIGKILL comes.
    farm = Farm({}, port=port, log_dir=settings.data_dir, token=token, stop_timeout=8)
    try:
        with stop_on_sigterm(), farm:
            farm.start_api()
            names = [f"embedded-{i}" for i in range(workers)]
            for n in names:
                farm.start_worker(n)
            farm.wait_workers(names, restart=True)  # a worker that dies this early is started again too
            console.print(f"enginefarm is up at {farm.url} (docs: {farm.url}/docs); data in {settings.data_dir}. "
                          f"Ctrl-C stops it.")
            console.print(f"an admin API token made for you (export ENGINEFARM_TOKEN=…): {token}", highlight=False)
            while True:
                farm.supervise()
                time.sleep(1)
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------------ client commands


@app.command()
def upload(file: Path = typer.Argument(..., exists=True, dir_okay=False), name: str = typer.Option(...),
           version: Optional[str] = None,
           project: Optional[str] = typer.Option(None, help="the project it belongs to (a project's token puts it "
                                                            "in its own)"),
           samples: Optional[Path] = typer.Option(None, exists=True, dir_okay=False,
                                                  help=".npz of sample inputs: int8 calibration and accuracy checks"),
           api: Optional[str] = API_OPT) -> None:
    """Upload an .onnx file, or a .zip/.tar bundle of model.onnx and its external data."""
    try:
        with _client(api) as c:
            with _bar() as bar:
                task = bar.add_task(f"upload {file.name}", total=file.stat().st_size)
                model, created = c.upload(file, name, version, on_bytes=lambda n: bar.advance(task, n), project=project)
            if samples:
                model = c.upload_samples(model["id"], samples)
    except Exception as exc:
        _fail(exc)
    console.print(f"{'uploaded' if created else 'already present'}: model {model['id']} "
                  f"{model['name']} v{model['version']} sha256 {model['sha256'][:12]}")
    if model.get("samples"):
        console.print(f"samples: {model['samples']['count']} per input, sha256 {model['samples']['sha256'][:12]}")


def _bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err)


@app.command()
def build(
    model_id: int = typer.Argument(..., help="model id (see `enginefarm ls models`)"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. tensorrt-rtx/sm86; repeat for more"),
    precision: Optional[str] = typer.Option(None, help="fp32 (default), fp16, bf16, int8 or fp8"),
    shapes: Optional[str] = typer.Option(None, "--shapes", help="trtexec syntax: input:1x3x224x224"),
    min_shapes: Optional[str] = typer.Option(None, "--minShapes"),
    opt_shapes: Optional[str] = typer.Option(None, "--optShapes"),
    max_shapes: Optional[str] = typer.Option(None, "--maxShapes"),
    spec_file: Optional[Path] = typer.Option(None, help="a JSON build spec; flags override its fields"),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help="benchmark at these batch sizes, e.g. 1,8,32"),
    bench_seconds: Optional[float] = typer.Option(None, "--bench-seconds", help="minimum measured time (default 3)"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="benchmark GPU engines through a CUDA graph"),
    no_bench: bool = typer.Option(False, "--no-bench", help="build only: no benchmark, no accuracy check"),
    val_range: Optional[list[str]] = typer.Option(None, "--val-range", help="generated input values, Polygraphy "
                                                  "syntax: input_ids:[0,30521] (repeatable)"),
    keep_fp32_ops: Optional[str] = typer.Option(None, "--keep-fp32-ops", help="fp16: op types kept fp32, e.g. Softmax,Pow"),
    keep_fp32_layers: Optional[str] = typer.Option(None, "--keep-fp32-layers", help="fp16: node names kept fp32"),
    cleanup: Optional[str] = typer.Option(None, "--cleanup", help="graph clean-up before building: onnxslim or none"),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="int8: minmax, entropy or percentile"),
    queue_without_worker: bool = QUEUE_OPT,
    wait: bool = typer.Option(False, "--wait", help="wait for every target and show progress"),
    timeout: float = typer.Option(3600, "--timeout", min=1, help="with --wait: give up after this many seconds "
                                                                 "(exit 1)"),
    api: Optional[str] = API_OPT,
) -> None:
    """Build a model for one or more targets; each engine is then benchmarked and checked against ONNX Runtime."""
    try:
        spec = json.loads(spec_file.read_text()) if spec_file else {}
        spec.update(spec_shapes_from_trtexec(shapes, min_shapes, opt_shapes, max_shapes))
        if precision:
            spec["precision"] = precision
        _bench_flags(spec, batch_sizes, bench_seconds, cuda_graph, no_bench)
        _precision_flags(spec, val_range, keep_fp32_ops, keep_fp32_layers, cleanup, calibration)
        with _client(api) as c:
            result = c.build(model_id, target, spec, queue_without_worker=queue_without_worker or None)
            console.print(f"build {result['id']} queued: {len(result['tasks'])} target(s)")
            if wait and sys.stderr.isatty():
                result = _wait_with_progress(c, result, timeout)
            elif wait:  # a CI log: one timestamped line per change instead of a redrawn bar
                from enginefarm.ci import wait_or_fail

                result, _ = wait_or_fail(c, result, timeout)
    except Exception as exc:
        _fail(exc)
    _print_tasks(result)
    if result.get("summary"):
        console.print(result["summary"])
    if any(t["state"] != "succeeded" for t in result["tasks"]) and wait:
        raise typer.Exit(1)


def _precision_flags(spec: dict, val_range: list[str] | None, ops: str | None, layers: str | None,
                     cleanup: str | None, calibration: str | None) -> None:
    if val_range:
        spec.setdefault("benchmark", {}).setdefault("value_ranges", {}).update(parse_val_ranges(val_range))
    if ops:
        spec["keep_fp32_ops"] = [o.strip() for o in ops.split(",") if o.strip()]
    if layers:
        spec["keep_fp32_layers"] = [n.strip() for n in layers.split(",") if n.strip()]
    if cleanup:
        spec["graph_cleanup"] = cleanup
    if calibration:
        spec.setdefault("calibration", {})["method"] = calibration


@app.command()
def logs(build_id: int, target: Optional[str] = typer.Option(None, "--target", "-t", help="only this target"),
         api: Optional[str] = API_OPT) -> None:
    """Print the builder log of each task of a build (the log's tail as the worker kept it), and its error."""
    try:
        with _client(api) as c:
            build = c.get(f"/v1/builds/{build_id}")
    except Exception as exc:
        _fail(exc)
    tasks = [t for t in build["tasks"] if target in (None, t["target"])]
    if not tasks:
        console.print(f"[red]build {build_id} has no task for {target}; its targets: {', '.join(build['targets'])}")
        raise typer.Exit(1)
    for t in tasks:
        console.rule(f"{t['target']}: {t['state']}")
        console.print(t["log_tail"] or "(no log yet)", markup=False, highlight=False, soft_wrap=True)
        if t["error"]:
            console.print(f"error: {t['error']}", markup=False, highlight=False, soft_wrap=True)


def _bench_flags(spec: dict, batch_sizes: str | None, seconds: float | None, cuda_graph: bool, off: bool) -> None:
    bench = spec.setdefault("benchmark", {})
    if batch_sizes:
        bench["batch_sizes"] = [int(b) for b in batch_sizes.split(",") if b.strip()]
    if seconds is not None:
        bench["duration_s"] = seconds
    if cuda_graph:
        bench["cuda_graph"] = True
    if off:
        bench["enabled"] = False
        spec.setdefault("accuracy", {})["enabled"] = False


@app.command()
def sweep(
    model_id: int = typer.Argument(..., help="model id (see `enginefarm ls models`)"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. tensorrt-rtx/sm86; repeat for more"),
    axis: list[str] = typer.Option(..., "--axis", "-a", help="FIELD=V1,V2: precision=fp32,fp16 or optimization_level=3,5"),
    spec_file: Optional[Path] = typer.Option(None, help="the JSON base spec every variant starts from"),
    queue_without_worker: bool = QUEUE_OPT,
    wait: bool = typer.Option(False, "--wait", help="wait for builds and benchmarks, then print the variants"),
    api: Optional[str] = API_OPT,
) -> None:
    """Build and benchmark every combination of the axes; the best variant per target is the fastest that
    passes the accuracy gate."""
    try:
        base = json.loads(spec_file.read_text()) if spec_file else {}
        axes: dict[str, list] = {}
        for item in axis:
            field, sep, values = item.partition("=")
            if not sep or not values:
                raise ValueError(f"--axis {item!r}: write FIELD=V1,V2")
            axes[field.strip()] = [json.loads(v) if v.strip().lstrip("-").isdigit() or v.strip() in ("true", "false")
                                   else v.strip() for v in values.split(",")]
        with _client(api) as c:
            result = c.sweep(model_id, target, axes, base, queue_without_worker=queue_without_worker or None)
            console.print(f"sweep {result['id']}: {len(result['variants'])} variant(s) × {len(target)} target(s)")
            if wait:
                for v in result["variants"]:
                    c.wait_build(v["build_id"])
                c.wait_checks(result["model_id"])
                result = c.get(f"/v1/sweeps/{result['id']}")
    except Exception as exc:
        _fail(exc)
    table = Table(title=f"sweep {result['id']}")
    for col in ("variant", "target", "state", "p50 ms", "p99 ms", "accuracy", "best"):
        table.add_column(col)
    for v in result["variants"]:
        for e in v["engines"]:
            acc = {True: "pass", False: "FAIL"}.get(e["accuracy_pass"], "—")
            table.add_row(v["variant"], e["target"], (e["checks"] or {}).get("detail") or e["task_state"],
                          f"{e['median_ms']:.3f}" if e["median_ms"] is not None else "—",
                          f"{e['p99_ms']:.3f}" if e["p99_ms"] is not None else "—", acc, "★" if e["best"] else "")
    console.print(table)


@app.command()
def report(
    model: str = typer.Argument(..., help="model name, or a model id"),
    version: Optional[str] = typer.Option(None, help="model version (default: the newest)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="also draw latency by target and batch size to this PNG"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    wait: bool = typer.Option(False, "--wait", help="wait for benchmarks that are queued or running"),
    api: Optional[str] = API_OPT,
) -> None:
    """Latency percentiles, throughput, accuracy and size for every target and shape, and the change since
    the previous version."""
    from enginefarm.report import plot_report, regression_table, report_table

    try:
        with _client(api) as c:
            model_id = int(model) if model.isdigit() else _pick_version(c.models(name=model, limit=500)["items"], model, version)
            data = c.wait_checks(model_id) if wait else c.report(model_id)
        if as_json:
            console.print_json(json.dumps(data))
            return
        console.print(report_table(data))
        if (regression := regression_table(data)) is not None:
            console.print(regression)
        if plot:
            console.print(f"plot: {plot_report(data, plot)}")
    except Exception as exc:
        _fail(exc)


def _pick_version(items: list[dict], name: str, version: str | None) -> int:
    uploaded = [m for m in items if not m.get("source_model_id")]
    if not uploaded:
        raise LookupError(f"no model {name!r} in the catalog")
    if version:
        match = [m for m in uploaded if m["version"] == version]
        if not match:
            raise LookupError(f"no model {name!r} version {version!r}")
        return match[0]["id"]
    return max(uploaded, key=lambda m: m["id"])["id"]


def _wait_with_progress(c, build: dict, timeout: float) -> dict:
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"), console=err) as bar:
        ids = {t["id"]: bar.add_task(t["target"], total=1, state=t["state"]) for t in build["tasks"]}

        def update(b: dict) -> None:
            for t in b["tasks"]:
                done = t["state"] in ("succeeded", "failed", "cancelled")
                bar.update(ids[t["id"]], completed=1 if done else 0, state=t["status_detail"] or t["state"])

        return c.wait_build(build["id"], timeout=timeout, on_update=update)


def _print_tasks(build: dict) -> None:
    table = Table(title=f"build {build['id']}")
    for col in ("target", "precision", "state", "engine", "wait s", "run s", "note"):
        table.add_column(col)
    for t in build["tasks"]:
        note = t["error"] or t["status_detail"] or t.get("precision_note") or \
            ("reused an identical build" if t["reused"] else "")
        table.add_row(t["target"], t.get("precision") or "", t["state"], str(t["engine_id"] or ""),
                      _secs(t["wait_seconds"]), _secs(t["run_seconds"]), note)
    console.print(table)


def _secs(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


FILTER_HELP = "keep only engines that passed their accuracy gate"


@app.command()
def fetch(
    model: str, output: Optional[Path] = typer.Option(None, "-o", "--output", help="where to write the engine"),
    version: Optional[str] = typer.Option(None, help='a model version, or "latest" (default: every version, ranked)'),
    cc: Optional[str] = typer.Option(None, help="compute capability, e.g. 8.6 (default: this machine's GPU)"),
    gpu: Optional[str] = typer.Option(None, help="GPU model name (default: this machine's)"),
    memory_mib: Optional[int] = typer.Option(None, "--memory-mib"),
    trt: Optional[str] = typer.Option(None, help="TensorRT runtime version (default: the importable tensorrt)"),
    trt_rtx: Optional[str] = typer.Option(None, help="TensorRT-RTX runtime version (default: the importable tensorrt_rtx)"),
    lean: Optional[bool] = typer.Option(None, "--lean/--no-lean", help="--trt is the lean runtime's version"),
    driver: Optional[str] = None, cuda: Optional[str] = None,
    platform: Optional[str] = typer.Option(None, help="x86_64 or aarch64"),
    jetpack: Optional[str] = None,
    precision: Optional[str] = None, spec_hash: Optional[str] = typer.Option(None, "--spec-hash"),
    accuracy: Optional[str] = typer.Option(None, help="'pass': " + FILTER_HELP),
    max_latency_ms: Optional[float] = typer.Option(None, "--max-latency-ms", help="measured median on your GPU model"),
    shapes: Optional[str] = typer.Option(None, "--shapes", help="the shapes you will run, trtexec syntax: "
                                         "images:1x3x640x640"),
    min_shapes: Optional[str] = typer.Option(None, "--minShapes", help="with --maxShapes: the range you will run"),
    opt_shapes: Optional[str] = typer.Option(None, "--optShapes"),
    max_shapes: Optional[str] = typer.Option(None, "--maxShapes"),
    precisions: Optional[str] = typer.Option(None, "--precisions", help="the precisions you accept, e.g. fp16,fp32 "
                                             "(default: any that passed its accuracy check, or fp16/fp32 unchecked)"),
    accept: Optional[list[str]] = typer.Option(None, "--accept", help="'unchecked': also int8/fp8 engines whose "
                                               "accuracy was never checked; 'failed': also engines that failed it"),
    explain: bool = typer.Option(False, "--explain", help="print every candidate with the rule that decided it"),
    build: bool = typer.Option(False, "--build", help="when nothing fits, build the engine this machine needs"),
    wait: bool = typer.Option(False, "--wait", help="with --build: wait for the build, then fetch"),
    timeout: float = typer.Option(3600, help="seconds --wait waits"),
    offline: bool = typer.Option(False, "--offline", help="resolve from the local cache alone"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR",
                                             help="local engine cache (default ~/.cache/enginefarm)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="download without keeping a copy in the cache"),
    api: Optional[str] = API_OPT,
) -> None:
    """Fetch the engine that runs on this machine (or the one the flags describe), verified by sha256.

    The farm judges every engine of MODEL against this machine's fingerprint and ranks the ones
    that run. A second fetch of the same engine copies it from the local cache.
    """
    from enginefarm.cache import EngineCache
    from enginefarm.client import resolve_offline
    from worker.probe import this_machine

    try:
        wanted_shapes = shape_request(shapes, min_shapes, opt_shapes, max_shapes)
        accepted = [p.strip() for p in (precisions or "").split(",") if p.strip()]
        unknown = sorted(set(accepted) - {p.value for p in Precision}) + sorted(set(accept or []) - set(ACCEPT))
        if unknown:
            raise ValueError(f"unknown value(s) {unknown}: --precisions takes {', '.join(p.value for p in Precision)}; "
                             f"--accept takes {' or '.join(ACCEPT)}")
    except ValueError as exc:
        _fail(exc)
    machine = this_machine(compute_capability=cc, gpu_name=gpu, memory_mib=memory_mib, trt_version=trt,
                           trt_rtx_version=trt_rtx, lean_runtime=lean, driver_version=driver, cuda_version=cuda,
                           platform=platform, jetpack=jetpack, shapes=wanted_shapes or None,
                           precisions=accepted or None)
    filters = dict(version=version, precision=precision, spec_hash=spec_hash, accuracy=accuracy,
                   max_latency_ms=max_latency_ms, accept=accept or None)
    cache = None if no_cache else EngineCache(cache_dir)
    if (wait and not build) or (offline and (build or no_cache)):
        _fail(ValueError("--wait goes with --build; --offline needs the cache and cannot build"))
    if not output and not explain:
        _fail(ValueError("give --output (or --explain alone to see the choice)"))
    try:
        if offline:
            answer = resolve_offline(cache, model, machine, **filters)
            if output:
                cache.copy_to(answer["engine"]["sha256"], output)
            _print_answer(answer, output, from_cache=True, explain=explain)
            return
        with _client(api) as c:
            if not output:
                _print_answer(c.resolve(model, machine, explain=True, **filters), None, False, True)
                return
            with _bar() as bar:
                progress = bar.add_task("engine", total=None)
                got = c.fetch(model, output, machine, cache=cache, build=build, wait=wait, wait_timeout=timeout,
                              explain=explain, on_bytes=lambda n: bar.advance(progress, n),
                              on_build=lambda b: bar.update(progress, description=_build_line(b)), **filters)
    except Exception as exc:
        _fail(exc)
    if got.path is None:
        b = got.build
        console.print(f"{b['detail']}\nstate: {b['status_detail'] or b['state']}; "
                      f"`enginefarm fetch {model} -o FILE --build --wait` fetches it once built")
        for reason in b["reasons"]:
            console.print(f"  - engine {reason['engine_id']} {reason['target']}: {reason['reason']}", highlight=False)
        return
    if got.build:
        console.print(f"built for this machine: build {got.build['build_id']} ({got.build['target']})")
    _print_answer(got.answer, output, from_cache=got.from_cache, explain=explain)


def _build_line(build: dict) -> str:
    return ", ".join(f"{t['target']} {t['status_detail'] or t['state']}" for t in build["tasks"])


def _print_answer(answer: dict, output: Optional[Path], from_cache: bool, explain: bool) -> None:
    eng = answer["engine"]
    if explain:
        table = Table(title=f"candidates for {answer.get('model', eng.get('model_name'))} on this machine")
        for col in ("rank", "engine", "target", "version", "precision", "match", "rule", "reason"):
            table.add_column(col)
        rows = answer.get("candidates") or answer["fallbacks"] + answer["rejected"]
        for r in rows:
            table.add_row(str(r["rank"] or "-"), str(r["engine_id"]), r["target"], r.get("model_version") or "",
                          r.get("precision") or "", r["match"] or "excluded", r.get("rule") or "", r["reason"])
        console.print(table)
        # Accuracy and profiles are long; a line per engine reads better than narrow table columns.
        for r in rows:
            label = profiles_label(r.get("profiles")).replace("\n", "; ")
            console.print(f"engine {r['engine_id']} ({r['target']}): accuracy {r.get('accuracy') or 'unchecked'}; "
                          f"profiles {label}", highlight=False)
        if answer.get("unchecked"):
            console.print(f"not checked: {', '.join(answer['unchecked'])}")
    if answer.get("accuracy", "unchecked") == "unchecked":
        console.print(f"note: the accuracy of engine {eng.get('id')} ({eng.get('precision')}) has not been checked "
                      "against ONNX Runtime FP32 yet", highlight=False)
    where = f"{output}: " if output else ""
    source = "from the local cache" if from_cache else "downloaded"
    console.print(f"{where}engine {eng.get('id')} ({eng['target']}, {answer['match']}): {answer['reason']}; "
                  f"sha256 {eng['sha256'][:12]} verified" + (f", {source}" if output else ""), highlight=False)


@export_app.command("triton")
def export_triton(
    model: str,
    out: Path = typer.Option(..., "--out", help="the Triton model repository directory (created if missing)"),
    version: Optional[str] = typer.Option(None, help="model version (default: the newest)"),
    spec_hash: Optional[str] = typer.Option(None, "--spec-hash", help="only engines of this build spec"),
    backend: Optional[str] = typer.Option(None, help="tensorrt or tensorrt-rtx (default: tensorrt where built)"),
    precision: Optional[str] = typer.Option(None, help="only engines of this precision"),
    accept: Optional[list[str]] = typer.Option(None, "--accept", help="'unchecked': also int8/fp8 engines whose "
                                               "accuracy was never checked; 'failed': also engines that failed it"),
    triton_version: int = typer.Option(1, "--triton-version", help="the Triton version directory to write"),
    name: Optional[str] = typer.Option(None, help="Triton model name (default: the catalog name, made safe)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace existing model directories"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR"),
    api: Optional[str] = API_OPT,
) -> None:
    """Write a Triton repository: one plan per compute capability (cc_model_filenames) and the ONNX CPU fallback.

    Each plan is the engine `enginefarm fetch --cc CC` picks with the same filters, full TensorRT first."""
    from enginefarm.cache import EngineCache
    from enginefarm.triton import export_from_farm

    try:
        with _client(api) as c:
            repo = export_from_farm(c, model, out, EngineCache(cache_dir), version=version, spec_hash=spec_hash,
                                    backend=backend, precision=precision, accept=accept,
                                    triton_version=triton_version, name=name, overwrite=overwrite)
    except Exception as exc:
        _fail(exc)
    console.print(f"wrote {', '.join(repo.models)} under {repo.root}:")
    for f in repo.files:
        console.print(f"  {f.relative_to(repo.root)}", highlight=False)
    for w in repo.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}")


@ls_app.command("models")
def ls_models(name: Optional[str] = None, api: Optional[str] = API_OPT) -> None:
    with _farm(api) as c:
        page = c.models(name=name, limit=500)
    table = Table(title=f"models ({page['total']})")
    for col in ("id", "name", "version", "sha256", "size", "opset", "inputs"):
        table.add_column(col)
    for m in page["items"]:
        inputs = ", ".join(f"{i['name']}{i['dims']}" for i in m["inputs"])
        table.add_row(str(m["id"]), m["name"], m["version"], m["sha256"][:12], str(m["size"]), str(m["opset"]), inputs)
    console.print(table)


def engines_table(items: list[dict], title: str) -> Table:
    table = Table(title=title)
    for col in ("id", "model", "target", "cc", "precision", "runtime", "platform", "size", "build s", "sha256"):
        table.add_column(col)
    for e in items:
        cc = e["compute_capability"] or ",".join(e["compute_capabilities"]) or "cpu"
        table.add_row(str(e["id"]), f"{e['model_name']} v{e['model_version']}", e["target"], cc, e["precision"],
                      e["trt_version"] or f"ort {e['backend_version']}", e["platform"], str(e["size"]),
                      f"{e['build_seconds']:.2f}", e["sha256"][:12])
    return table


@ls_app.command("engines")
def ls_engines(model: Optional[str] = None, target: Optional[str] = None, cc: Optional[str] = None,
               precision: Optional[str] = None, api: Optional[str] = API_OPT) -> None:
    with _farm(api) as c:
        page = c.engines(model=model, target=target, cc=cc, precision=precision, limit=500)
    console.print(engines_table(page["items"], f"engines ({page['total']})"))


@ls_app.command("builds")
def ls_builds(api: Optional[str] = API_OPT) -> None:
    with _farm(api) as c:
        for b in c.builds():
            _print_tasks(b)


@ls_app.command("workers")
def ls_workers(api: Optional[str] = API_OPT) -> None:
    with _farm(api) as c:
        live = c.workers()
    table = Table(title=f"live workers ({len(live)})")
    for col in ("id", "targets", "last seen"):
        table.add_column(col)
    for w in live:
        table.add_row(w["id"], ", ".join(w["targets"]), w["last_seen"])
    console.print(table)


@app.command()
def demo(data_dir: Optional[Path] = typer.Option(None, help="where the demo farm keeps its data (default: a new temp dir)")) -> None:
    """Start an embedded farm, build a small model for 5 targets, print the catalog, fetch the sm86 engine."""
    from enginefarm.demo import run_demo
    from enginefarm.embedded import stop_on_sigterm

    with stop_on_sigterm():
        code = run_demo(data_dir, console)
    sys.exit(code)


app.command("ci")(ci_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
