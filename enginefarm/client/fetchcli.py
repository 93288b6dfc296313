"""The deploy-side commands: ``fetch`` (resolve and download the engine that runs here) and ``export triton`` (the
engines of every compute capability as a Triton model repository). Registered on the ``enginefarm`` app by
``enginefarm.client.cli``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from enginefarm.client.artifacts import session_file
from enginefarm.client.report import profiles_label
from enginefarm.client.terminal import API_OPT, client_for, console, err, fail, farm_call, transfer_bar
from enginefarm.core.machine import Machine
from enginefarm.core.shapes import shape_request
from enginefarm.core.spec import PRECISIONS, Precision
from enginefarm.core.wanted import ACCEPT

export_app = typer.Typer(help="Export a catalogued model for a serving system.", no_args_is_help=True)


FILTER_HELP = "keep only engines that passed their accuracy gate"


def fetch(
    ctx: typer.Context,
    model: str,
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        help="where to write the engine "
        "(default: <model>-<target>.plan, or .onnx for an ONNX "
        "Runtime model, here or in the folder given)",
    ),
    version: str | None = typer.Option(None, help='a model version, or "latest" (default: every version, ranked)'),
    cc: str | None = typer.Option(None, help="compute capability, e.g. 8.6 (default: this machine's GPU)"),
    gpu: str | None = typer.Option(None, help="GPU model name (default: this machine's)"),
    memory_mib: int | None = typer.Option(None, "--memory-mib", help="GPU memory in MiB (default: this GPU's)"),
    trt: str | None = typer.Option(None, help="TensorRT runtime version (default: the importable tensorrt)"),
    trt_rtx: str | None = typer.Option(
        None, help="TensorRT-RTX runtime version (default: the importable tensorrt_rtx)"
    ),
    lean: bool | None = typer.Option(None, "--lean/--no-lean", help="--trt is the lean runtime's version"),
    driver: str | None = typer.Option(None, help="NVIDIA driver version (default: this machine's)"),
    cuda: str | None = typer.Option(None, help="CUDA version the runtime uses (default: this machine's)"),
    platform: str | None = typer.Option(None, help="x86_64 or aarch64"),
    jetpack: str | None = typer.Option(None, help="JetPack release on a Jetson (default: read from the device)"),
    precision: str | None = typer.Option(None, help=f"only engines of this precision: {', '.join(PRECISIONS)}"),
    spec_hash: str | None = typer.Option(None, "--spec-hash", help="only engines built with this spec"),
    backend: str | None = typer.Option(
        None,
        help="only engines of this backend: tensorrt, tensorrt-rtx or "
        "onnxruntime (naming onnxruntime asks for the CPU model)",
    ),
    accuracy: str | None = typer.Option(None, help="'pass': " + FILTER_HELP),
    max_latency_ms: float | None = typer.Option(None, "--max-latency-ms", help="measured median on your GPU model"),
    shapes: str | None = typer.Option(
        None, "--shapes", help="the shapes you will run, trtexec syntax: images:1x3x640x640"
    ),
    min_shapes: str | None = typer.Option(None, "--minShapes", help="with --maxShapes: the range you will run"),
    opt_shapes: str | None = typer.Option(None, "--optShapes", help="the shapes you will run most"),
    max_shapes: str | None = typer.Option(None, "--maxShapes", help="with --minShapes: the range you will run"),
    precisions: str | None = typer.Option(
        None,
        "--precisions",
        help="the precisions you accept, e.g. fp16,fp32 "
        "(default: any that passed its accuracy check, or fp16/fp32 unchecked)",
    ),
    accept: list[str] | None = typer.Option(
        None,
        "--accept",
        help="'unchecked': also int8/fp8 engines whose "
        "accuracy was never checked; 'failed': also engines that failed it",
    ),
    allow_cpu: bool = typer.Option(
        False,
        "--allow-cpu",
        help="also take an ONNX Runtime model (CPU) when no "
        "engine of this machine's GPU runtime fits (sends accept=cpu)",
    ),
    explain: bool = typer.Option(False, "--explain", help="print every candidate with the rule that decided it"),
    build: bool = typer.Option(False, "--build", help="when nothing fits, build the engine this machine needs"),
    wait: bool = typer.Option(False, "--wait", help="with --build: wait for the build, then fetch"),
    timeout: float = typer.Option(3600, help="seconds --wait waits"),
    offline: bool = typer.Option(False, "--offline", help="resolve from the local cache alone"),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR", help="local engine cache (default ~/.cache/enginefarm)"
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="download without keeping a copy in the cache"),
    measure: bool = typer.Option(
        False, "--measure", help="then time and check it here and post the figures (enginefarm measure --engine)"
    ),
    api: str | None = API_OPT,
) -> None:
    """Fetch the engine that runs on this machine (or the one the flags describe), verified by sha256.

    The farm judges every engine of MODEL against this machine's fingerprint and ranks the ones
    that run. A second fetch of the same engine copies it from the local cache. An engine of another
    kind than the --output name says (an ONNX model for x.plan) is refused, and nothing is written.
    With --explain and no --output, only the choice is printed.
    """
    from enginefarm.client import resolve_offline
    from enginefarm.client.artifacts import place_cached
    from enginefarm.client.cache import EngineCache
    from enginefarm.core.probe.machineprobe import this_machine

    try:
        wanted_shapes = shape_request(shapes, min_shapes, opt_shapes, max_shapes)
        accepted = [p.strip() for p in (precisions or "").split(",") if p.strip()]
        unknown = sorted(set(accepted) - {p.value for p in Precision}) + sorted(set(accept or []) - set(ACCEPT))
        if unknown:
            raise ValueError(
                f"unknown value(s) {unknown}: --precisions takes {', '.join(p.value for p in Precision)}; "
                f"--accept takes {' or '.join(ACCEPT)}"
            )
        machine = this_machine(
            compute_capability=cc,
            gpu_name=gpu,
            memory_mib=memory_mib,
            trt_version=trt,
            trt_rtx_version=trt_rtx,
            lean_runtime=lean,
            driver_version=driver,
            cuda_version=cuda,
            platform=platform,
            jetpack=jetpack,
            shapes=wanted_shapes or None,
            precisions=accepted or None,
        )
    except ValueError as exc:  # pydantic's ValidationError is one: a flag the fingerprint's rules refuse
        fail(exc)
    if explain:  # the fingerprint judged: the flags over this machine's own probe
        console.print(f"as the machine: {_fingerprint(machine)}", highlight=False)
    filters: dict[str, Any] = dict(
        version=version,
        precision=precision,
        spec_hash=spec_hash,
        accuracy=accuracy,
        max_latency_ms=max_latency_ms,
        backend=backend,
        accept=accept or None,
    )
    cache = None if no_cache else EngineCache(cache_dir)
    if (wait and not build) or (offline and (build or no_cache or measure)):
        fail(ValueError("--wait goes with --build; --offline needs the cache, and cannot build or post a measurement"))
    only_explain = explain and not output
    try:
        if offline:
            assert cache is not None  # --offline without the cache was refused above
            answer = resolve_offline(cache, model, machine, allow_cpu=allow_cpu, **filters)
            written = None if only_explain else place_cached(cache, answer["engine"], output)
            _print_answer(answer, written, from_cache=True, explain=explain)
            return
        with client_for(api) as c:
            if only_explain:
                _print_answer(
                    c.resolve(model, machine, explain=True, allow_cpu=allow_cpu, **filters), None, False, True
                )
                return
            bar = transfer_bar()
            progress = bar.add_task("engine", total=None)

            def shown() -> Progress:  # the bar starts once there is something to show: a refusal is its line alone
                if not bar.live.is_started:
                    bar.start()
                return bar

            try:
                got = c.fetch(
                    model,
                    output,
                    machine,
                    cache=cache,
                    build=build,
                    wait=wait,
                    wait_timeout=timeout,
                    explain=explain,
                    allow_cpu=allow_cpu,
                    on_bytes=lambda n: shown().advance(progress, n),
                    on_size=lambda n: bar.update(progress, total=n),
                    on_build=lambda b: shown().update(progress, description=_build_line(b)),
                    **filters,
                )
            finally:
                if bar.live.is_started:
                    bar.stop()
    except Exception as exc:  # noqa: BLE001 - every failure is printed in one line, then the command exits 1
        fail(exc)
    if got.path is None:
        b = got.build
        assert b is not None  # no file: the build queued for this machine
        console.print(
            f"{b['detail']}\nspec: {_spec_of(b)}\n"
            f"state: {b['status_detail'] or b['state']}; "
            f"`enginefarm fetch {model} -o FILE --build --wait` fetches it once built"
        )
        for reason in b["reasons"]:
            console.print(f"  - engine {reason['engine_id']} {reason['target']}: {reason['reason']}", highlight=False)
        return
    if got.build:
        b = got.build
        console.print(
            f"built for this machine: build {b['build_id']} ({b['target']}, {_spec_of(b)}; "
            "--precision or --spec-hash choose another)"
        )
    _print_answer(got.answer, got.path, from_cache=got.from_cache, explain=explain)
    if measure:
        _measure(ctx, got.answer["engine"]["id"], cache_dir, api)


def _measure(ctx: typer.Context, engine_id: int, cache_dir: Path | None, api: str | None) -> None:
    """``enginefarm measure --engine ID``, as registered on the root command (by ``enginefarm.measure``, whose
    runtimes come from the ``measure-*`` extras)."""
    root = ctx.find_root()
    group = getattr(root.command, "get_command", None)
    command = group(root, "measure") if group else None
    if command is None:
        fail(ValueError("--measure needs the measure command of enginefarm.measure, which this install lacks"))
        return
    args = ["--engine", str(engine_id), *(["--cache-dir", str(cache_dir)] if cache_dir else [])]
    code = command.main([*args, *(["--api", api] if api else [])], "enginefarm measure", standalone_mode=False)
    if code:  # its failure is printed already: exit as it did
        raise typer.Exit(code)


def _spec_of(build: dict[str, Any]) -> str:
    """What a build for the machine builds, and whose spec it copied."""
    return f"{build.get('precision', '?')}, from {build.get('spec_from', 'the latest build spec')}"


def _fingerprint(m: Machine) -> str:
    parts = [
        m.platform,
        m.gpu_name,
        m.compute_capability and f"cc {m.compute_capability}",
        m.trt_version and f"TensorRT {m.trt_version}{' (lean)' if m.lean_runtime else ''}",
        m.trt_rtx_version and f"TensorRT-RTX {m.trt_rtx_version}",
        m.ort_version and f"ONNX Runtime {m.ort_version}",
        m.driver_version and f"driver {m.driver_version}",
    ]
    return ", ".join(p for p in parts if p) or "nothing detected"


def _build_line(build: dict[str, Any]) -> str:
    return ", ".join(f"{t['target']} {t['status_detail'] or t['state']}" for t in build["tasks"])


def _print_answer(answer: dict[str, Any], output: Path | None, from_cache: bool, explain: bool) -> None:
    eng = answer["engine"]
    if explain:
        table = Table(title=f"candidates for {answer.get('model', eng.get('model_name'))} on this machine")
        for col in ("rank", "engine", "target", "version", "precision", "match", "rule", "reason"):
            table.add_column(col)
        rows = answer.get("candidates") or answer["fallbacks"] + (answer.get("rejected") or [])
        for r in rows:
            table.add_row(
                str(r["rank"] or "-"),
                str(r["engine_id"]),
                r["target"],
                r.get("model_version") or "",
                r.get("precision") or "",
                r["match"] or "excluded",
                r.get("rule") or "",
                r["reason"],
            )
        console.print(table)
        # Accuracy and profiles are long; a line per engine reads better than narrow table columns.
        for r in rows:
            label = profiles_label(r.get("profiles")).replace("\n", "; ")
            console.print(
                f"engine {r['engine_id']} ({r['target']}): accuracy {r.get('accuracy') or 'unchecked'}; "
                f"profiles {label}",
                highlight=False,
            )
        if answer.get("unchecked"):
            console.print(f"not checked: {', '.join(answer['unchecked'])}")
    if answer.get("accuracy", "unchecked") == "unchecked":
        console.print(
            f"note: the accuracy of engine {eng.get('id')} ({eng.get('precision')}) has not been checked "
            "against ONNX Runtime FP32 yet",
            highlight=False,
        )
    where = f"{output}: " if output else ""
    source = "from the local cache" if from_cache else "downloaded"
    digest = f"sha256 {eng['sha256'][:12]}" + (f" verified, {source}" if output else "; not downloaded")
    console.print(
        f"{where}engine {eng.get('id')} ({eng['target']}, {answer['match']}): {answer['reason']}; {digest}",
        highlight=False,
    )
    if output and (side := session_file(output)).is_file() and eng.get("run_options"):
        options = ", ".join(f"{k}={v}" for k, v in sorted(eng["run_options"].items()))
        console.print(f"{side}: load it with the CUDA provider options {options} (measured fastest)", highlight=False)


@export_app.command("triton")
def export_triton(
    model: str,
    out: Path = typer.Option(..., "--out", help="the Triton model repository directory (created if missing)"),
    version: str | None = typer.Option(None, help="model version (default: the newest)"),
    spec_hash: str | None = typer.Option(None, "--spec-hash", help="only engines of this build spec"),
    backend: str | None = typer.Option(None, help="tensorrt or tensorrt-rtx (default: tensorrt where built)"),
    precision: str | None = typer.Option(None, help="only engines of this precision"),
    accept: list[str] | None = typer.Option(
        None,
        "--accept",
        help="'unchecked': also int8/fp8 engines whose "
        "accuracy was never checked; 'failed': also engines that failed it",
    ),
    triton_version: int = typer.Option(1, "--triton-version", help="the Triton version directory to write"),
    name: str | None = typer.Option(None, help="Triton model name (default: the catalog name, made safe)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace existing model directories"),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR", help="local engine cache (default ~/.cache/enginefarm)"
    ),
    api: str | None = API_OPT,
) -> None:
    """Write a Triton repository: one plan per compute capability (cc_model_filenames) and the ONNX CPU fallback.

    Each plan is the engine `enginefarm fetch --cc CC` picks with the same filters, full TensorRT first."""
    from enginefarm.client.cache import EngineCache
    from enginefarm.client.tritonexport import export_from_farm

    with farm_call(api) as c:
        repo = export_from_farm(
            c,
            model,
            out,
            EngineCache(cache_dir),
            version=version,
            spec_hash=spec_hash,
            backend=backend,
            precision=precision,
            accept=accept,
            triton_version=triton_version,
            name=name,
            overwrite=overwrite,
        )
    console.print(f"wrote {', '.join(repo.models)} under {repo.root}:")
    for f in repo.files:
        console.print(f"  {f.relative_to(repo.root)}", highlight=False)
    for w in repo.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}")


def register(app: typer.Typer) -> None:
    """Add ``fetch`` and ``export`` to the ``enginefarm`` app."""
    app.command()(fetch)
    app.add_typer(export_app, name="export")
