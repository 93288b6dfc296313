"""The ``enginefarm`` command line (typer + rich)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from enginefarm.client.ci import TRTEXEC_ARGS_OPT, TRTEXEC_CONTEXT, TRTEXEC_HELP, build_spec, ci_command, trtexec_flags
from enginefarm.compat import ACCEPT
from enginefarm.spec import Precision
from enginefarm.shapes import parse_val_ranges, shape_request
from enginefarm.client.report import profiles_label

app = typer.Typer(help="enginefarm: build TensorRT engines for every GPU, fetch the one that runs here.",
                  no_args_is_help=True, pretty_exceptions_show_locals=False)
ls_app = typer.Typer(help="List what the catalog holds.", no_args_is_help=True)
app.add_typer(ls_app, name="ls")
export_app = typer.Typer(help="Export a catalogued model for a serving system.", no_args_is_help=True)
app.add_typer(export_app, name="export")
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
        fail(exc)


def fail(exc: Exception) -> None:
    import httpx

    if isinstance(exc, httpx.TransportError):
        try:  # where the request went: --api, else ENGINEFARM_API_URL, else the default
            url = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        except RuntimeError:  # an error raised before any request was made
            url = os.environ.get("ENGINEFARM_API_URL") or "http://127.0.0.1:8321"
        err.print(f"[red]error:[/red] cannot reach the farm at {url} ({exc}); it is looked for at --api or "
                  f"ENGINEFARM_API_URL; `enginefarm up` starts one")
        raise typer.Exit(1)
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):  # a fingerprint flag (--cc, --driver, ...) the rules cannot take
        err.print(f"[red]error:[/red] {exc.error_count()} value(s) cannot be used:")
        for e in exc.errors():
            err.print(f"  - {'.'.join(str(x) for x in e['loc'])}: {e['msg']}", highlight=False)
        raise typer.Exit(1)
    err.print(f"[red]error:[/red] {getattr(exc, 'message', exc)}")
    for problem in getattr(exc, "problems", None) or []:
        where = ".".join(str(p) for p in problem.get("loc", [])) or problem.get("target", "")
        err.print(f"  - {where}: {problem.get('msg') or problem.get('reason')}")
    raise typer.Exit(1)

API_OPT = typer.Option(None, "--api", envvar="ENGINEFARM_API_URL", help="farm URL (default http://127.0.0.1:8321)")
QUEUE_OPT = typer.Option(False, "--queue-without-worker",
                         help="queue targets no live worker serves now, to wait for one (default: refused)")


def _version(show: bool) -> None:
    if show:
        from enginefarm import __version__

        print(f"enginefarm {__version__}")
        raise typer.Exit()


@app.callback()
def _global(token: Optional[str] = typer.Option(None, "--token", envvar="ENGINEFARM_TOKEN", show_envvar=True,
                                                help="API token for the farm's REST API"),
            version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                         help="print the version and exit")) -> None:
    if token:  # the client reads it from the environment
        os.environ["ENGINEFARM_TOKEN"] = token


@app.command()
def upload(file: Path = typer.Argument(..., exists=True, dir_okay=False, help=".onnx file or .zip/.tar bundle"),
           name: str = typer.Option(..., help="the model's name in the catalog"),
           version: Optional[str] = typer.Option(None, help="the version to upload as (default: the next integer)"),
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
        fail(exc)
    console.print(f"{'uploaded' if created else 'already present'}: model {model['id']} "
                  f"{model['name']} v{model['version']} sha256 {model['sha256'][:12]}")
    if model.get("samples"):
        console.print(f"samples: {model['samples']['count']} per input, sha256 {model['samples']['sha256'][:12]}")


def _bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err)


@app.command(context_settings=TRTEXEC_CONTEXT)
def build(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="model id, name (its newest version) or name:version"),
    target: list[str] = typer.Option(..., "--target", "-t", help="e.g. tensorrt-rtx/sm86; repeat for more"),
    precision: Optional[str] = typer.Option(None, help="fp32 (default), fp16, bf16, int8 or fp8"),
    trtexec_args: Optional[str] = TRTEXEC_ARGS_OPT,
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
        spec = build_spec(spec_file, precision, trtexec_flags(ctx, trtexec_args))
        _bench_flags(spec, batch_sizes, bench_seconds, cuda_graph, no_bench)
        _precision_flags(spec, val_range, keep_fp32_ops, keep_fp32_layers, cleanup, calibration)
        with _client(api) as c:
            result = c.build(model, target, spec, queue_without_worker=queue_without_worker or None)
            console.print(f"build {result['id']} queued: {len(result['tasks'])} target(s)")
            if wait and sys.stderr.isatty():
                result = _wait_with_progress(c, result, timeout)
            elif wait:  # a CI log: one timestamped line per change instead of a redrawn bar
                from enginefarm.client.ci import wait_or_fail

                result, _ = wait_or_fail(c, result, timeout)
    except Exception as exc:
        fail(exc)
    _print_tasks(result)
    if result.get("summary"):
        console.print(result["summary"])
    if any(t["state"] != "succeeded" for t in result["tasks"]) and wait:
        raise typer.Exit(1)


build.__doc__ += TRTEXEC_HELP


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
        fail(exc)
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
    model: str = typer.Argument(..., help="model id, name (its newest version) or name:version"),
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
            result = c.sweep(c.model_id(model), target, axes, base, queue_without_worker=queue_without_worker or None)
            console.print(f"sweep {result['id']}: {len(result['variants'])} variant(s) × {len(target)} target(s)")
            if wait:
                for v in result["variants"]:
                    c.wait_build(v["build_id"])
                c.wait_checks(result["model_id"])
                result = c.get(f"/v1/sweeps/{result['id']}")
    except Exception as exc:
        fail(exc)
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
    from enginefarm.client.report import plot_report, regression_table, report_table

    if plot:
        need("plot")
    try:
        with _client(api) as c:
            model_id = c.model_id(f"{model}:{version}" if version and not model.isdigit() else model)
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
        fail(exc)


def _wait_with_progress(c, build: dict, timeout: float) -> dict:
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"), console=err) as bar:
        ids = {t["id"]: bar.add_task(t["target"], total=1, state=t["state"]) for t in build["tasks"]}

        def update(b: dict) -> None:
            for t in b["tasks"]:
                done = t["state"] in ("succeeded", "failed", "cancelled")
                bar.update(ids[t["id"]], completed=1 if done else 0, state=t["status_detail"] or t["state"])

        return c.wait_build(build["id"], timeout=timeout, on_update=update)


def _print_tasks(build: dict) -> None:
    table = Table(title=f"build {build['id']} of model {build['model_id']}, {build['state']}, {build['created_at'][:19]}")
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
    memory_mib: Optional[int] = typer.Option(None, "--memory-mib", help="GPU memory in MiB (default: this GPU's)"),
    trt: Optional[str] = typer.Option(None, help="TensorRT runtime version (default: the importable tensorrt)"),
    trt_rtx: Optional[str] = typer.Option(None, help="TensorRT-RTX runtime version (default: the importable tensorrt_rtx)"),
    lean: Optional[bool] = typer.Option(None, "--lean/--no-lean", help="--trt is the lean runtime's version"),
    driver: Optional[str] = typer.Option(None, help="NVIDIA driver version (default: this machine's)"),
    cuda: Optional[str] = typer.Option(None, help="CUDA version the runtime uses (default: this machine's)"),
    platform: Optional[str] = typer.Option(None, help="x86_64 or aarch64"),
    jetpack: Optional[str] = typer.Option(None, help="JetPack release on a Jetson (default: read from the device)"),
    precision: Optional[str] = typer.Option(None, help="only engines of this precision: fp32, fp16, bf16, int8, fp8"),
    spec_hash: Optional[str] = typer.Option(None, "--spec-hash", help="only engines built with this spec"),
    accuracy: Optional[str] = typer.Option(None, help="'pass': " + FILTER_HELP),
    max_latency_ms: Optional[float] = typer.Option(None, "--max-latency-ms", help="measured median on your GPU model"),
    shapes: Optional[str] = typer.Option(None, "--shapes", help="the shapes you will run, trtexec syntax: "
                                         "images:1x3x640x640"),
    min_shapes: Optional[str] = typer.Option(None, "--minShapes", help="with --maxShapes: the range you will run"),
    opt_shapes: Optional[str] = typer.Option(None, "--optShapes", help="the shapes you will run most"),
    max_shapes: Optional[str] = typer.Option(None, "--maxShapes", help="with --minShapes: the range you will run"),
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
    from enginefarm.client.cache import EngineCache
    from enginefarm.client import resolve_offline
    from enginefarm.probe import this_machine

    try:
        wanted_shapes = shape_request(shapes, min_shapes, opt_shapes, max_shapes)
        accepted = [p.strip() for p in (precisions or "").split(",") if p.strip()]
        unknown = sorted(set(accepted) - {p.value for p in Precision}) + sorted(set(accept or []) - set(ACCEPT))
        if unknown:
            raise ValueError(f"unknown value(s) {unknown}: --precisions takes {', '.join(p.value for p in Precision)}; "
                             f"--accept takes {' or '.join(ACCEPT)}")
        machine = this_machine(compute_capability=cc, gpu_name=gpu, memory_mib=memory_mib, trt_version=trt,
                               trt_rtx_version=trt_rtx, lean_runtime=lean, driver_version=driver, cuda_version=cuda,
                               platform=platform, jetpack=jetpack, shapes=wanted_shapes or None,
                               precisions=accepted or None)
    except ValueError as exc:  # pydantic's ValidationError is one: a flag the fingerprint's rules refuse
        fail(exc)
    filters = dict(version=version, precision=precision, spec_hash=spec_hash, accuracy=accuracy,
                   max_latency_ms=max_latency_ms, accept=accept or None)
    cache = None if no_cache else EngineCache(cache_dir)
    if (wait and not build) or (offline and (build or no_cache)):
        fail(ValueError("--wait goes with --build; --offline needs the cache and cannot build"))
    if not output and not explain:
        fail(ValueError("give --output (or --explain alone to see the choice)"))
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
        fail(exc)
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
        rows = answer.get("candidates") or answer["fallbacks"] + (answer.get("rejected") or [])
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
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR",
                                             help="local engine cache (default ~/.cache/enginefarm)"),
    api: Optional[str] = API_OPT,
) -> None:
    """Write a Triton repository: one plan per compute capability (cc_model_filenames) and the ONNX CPU fallback.

    Each plan is the engine `enginefarm fetch --cc CC` picks with the same filters, full TensorRT first."""
    from enginefarm.client.cache import EngineCache
    from enginefarm.client.triton import export_from_farm

    try:
        with _client(api) as c:
            repo = export_from_farm(c, model, out, EngineCache(cache_dir), version=version, spec_hash=spec_hash,
                                    backend=backend, precision=precision, accept=accept,
                                    triton_version=triton_version, name=name, overwrite=overwrite)
    except Exception as exc:
        fail(exc)
    console.print(f"wrote {', '.join(repo.models)} under {repo.root}:")
    for f in repo.files:
        console.print(f"  {f.relative_to(repo.root)}", highlight=False)
    for w in repo.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}")


@ls_app.command("models")
def ls_models(name: Optional[str] = typer.Option(None, help="only the versions of this model"),
              api: Optional[str] = API_OPT) -> None:
    """Models and their versions, with their inputs."""
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
def ls_engines(model: Optional[str] = typer.Option(None, help="only this model's engines (its name)"),
               target: Optional[str] = typer.Option(None, help="only this target, e.g. tensorrt-rtx/sm86"),
               cc: Optional[str] = typer.Option(None, help="only engines that run on this compute capability"),
               precision: Optional[str] = typer.Option(None, help="only this precision"),
               api: Optional[str] = API_OPT) -> None:
    """Engines in the catalog, with what they were built for."""
    with _farm(api) as c:
        page = c.engines(model=model, target=target, cc=cc, precision=precision, limit=500)
    console.print(engines_table(page["items"], f"engines ({page['total']})"))


@ls_app.command("builds")
def ls_builds(model: Optional[str] = typer.Option(None, "--model", help="only this model's builds: id, name (its "
                                                                         "newest version) or name:version"),
              limit: int = typer.Option(20, "--limit", min=1, max=500, help="at most this many, newest first"),
              api: Optional[str] = API_OPT) -> None:
    """Builds, newest first, each with its targets' states."""
    with _farm(api) as c:
        builds = c.builds(model_id=c.model_id(model) if model else None, limit=limit)
        for b in builds:
            _print_tasks(b)
        if not builds:
            console.print("no builds" + (f" of {model}" if model else ""))


@ls_app.command("workers")
def ls_workers(api: Optional[str] = API_OPT) -> None:
    """Live workers and the targets each builds."""
    with _farm(api) as c:
        live = c.workers()
    table = Table(title=f"live workers ({len(live)})")
    for col in ("id", "targets", "last seen"):
        table.add_column(col)
    for w in live:
        table.add_row(w["id"], ", ".join(w["targets"]), w["last_seen"])
    console.print(table)


app.command("ci", context_settings=TRTEXEC_CONTEXT)(ci_command)

# Where a command's extra is missing, the pip line that adds it.
EXTRA_MODULES = {"server": ("fastapi", "sqlalchemy", "alembic", "boto3", "uvicorn"),
                 "worker": ("celery", "onnx", "onnxruntime", "numpy"), "rtx": ("tensorrt_rtx",), "plot": ("matplotlib",)}


def missing_extras(*extras: str) -> list[str]:
    """Those of ``extras`` whose packages are not all installed here."""
    from importlib.util import find_spec

    return [extra for extra in extras if any(find_spec(module) is None for module in EXTRA_MODULES[extra])]


def need(*extras: str) -> None:
    """End the command with the pip line to run when any of ``extras`` is not installed."""
    if missing := missing_extras(*extras):
        from rich.markup import escape

        names = ", ".join(repr(m) for m in missing)
        err.print(escape(f"error: this command needs the {names} extra{'s' if len(missing) > 1 else ''}: "
                         f"pip install 'enginefarm[{','.join(missing)}]'"))
        raise typer.Exit(2)


def main() -> None:
    """``enginefarm``: the client commands, and the farm's own (``enginefarm.commands`` entry points)."""
    from importlib.metadata import entry_points

    for plugin in entry_points(group="enginefarm.commands"):
        plugin.load()(app)
    app()


if __name__ == "__main__":
    main()
