"""``enginefarm measure MODEL``: on a deploy machine, fetch the engine the farm hands this machine (or a named one),
time it here with the farm's runner and rules, and post the figure back, so the farm ranks engines for this
machine's class by what machines of that class measured. Registered through the ``enginefarm.commands`` entry
point; the runtimes come from the ``measure-*`` extras and are imported only when the command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from enginefarm.client.terminal import API_OPT, console, err, fail, farm_call, need
from enginefarm.core.spec import DEFAULT_SHAPE_KEY

# The extra whose runtime runs each kind of engine (the target's prefix), as enginefarm.client.terminal names them.
RUNTIME_EXTRAS = {
    "onnxruntime/cpu-": "measure-ort",
    "onnxruntime/cuda-": "measure-cuda",
    "tensorrt-rtx/": "measure-rtx",
    "tensorrt/": "measure-trt",
}


def extra_for(target: str) -> str:
    return next((extra for prefix, extra in RUNTIME_EXTRAS.items() if target.startswith(prefix)), "measure-ort")


def measure(
    model: str | None = typer.Argument(None, help="the model whose engine for this machine to measure"),
    version: str | None = typer.Option(None, help="a model version (default: every version, ranked)"),
    engine_id: int | None = typer.Option(None, "--engine", help="measure this engine id, not the one resolve picks"),
    shapes: str | None = typer.Option(
        None, "--shapes", help="input shapes, trtexec syntax (default: those the farm measured the engine at)"
    ),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="take the CPU artifact where no GPU engine fits"),
    warmup_ms: int = typer.Option(200, "--warmUp", help="warm-up in ms (trtexec's --warmUp)"),
    duration_s: float = typer.Option(3.0, "--duration", help="minimum measured seconds (trtexec's --duration)"),
    iterations: int = typer.Option(10, "--iterations", help="minimum measured iterations (trtexec's --iterations)"),
    threads: int | None = typer.Option(None, "--threads", help="ONNX Runtime CPU threads (default: every core)"),
    check: bool = typer.Option(
        True, "--check/--no-check", help="check the engine's outputs against the farm's fp32 reference outputs"
    ),
    post: bool = typer.Option(True, "--post/--no-post", help="post the figure to the farm (scope measure)"),
    as_json: bool = typer.Option(False, "--json", help="print the figure (and the farm's record of it) as JSON"),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", envvar="ENGINEFARM_CACHE_DIR", help="local engine cache (default ~/.cache/enginefarm)"
    ),
    api: str | None = API_OPT,
) -> None:
    """Measure, on this machine, the engine the farm hands it, and post the figure back.

    The engine is timed as the farm times it (trtexec's warm-up, duration and percentiles, the farm's seeded
    inputs) at the shapes the farm's own benchmark of it ran at, so the two figures compare. The farm then ranks
    engines for machines of this class (its GPU model, its compute capability, or its CPU for the CPU artifact) by
    the median over the machines that measured them. Posting needs a token of scope measure (ENGINEFARM_TOKEN).
    """
    from enginefarm.client.cache import EngineCache
    from enginefarm.core.domain import ModelInfo, TensorInfo
    from enginefarm.core.probe.machineprobe import this_machine
    from enginefarm.core.shapes import parse_trtexec_shapes
    from enginefarm.core.spec import BenchmarkSpec

    try:
        if model is None and engine_id is None:
            raise ValueError("name the MODEL whose engine for this machine to measure, or the engine: --engine ID")
        given = parse_trtexec_shapes(shapes) if shapes else {}
        bench = BenchmarkSpec(warmup_ms=warmup_ms, duration_s=duration_s, iterations=iterations, threads=threads)
        machine = this_machine()
    except ValueError as exc:
        fail(exc)
    cache = EngineCache(cache_dir)
    with farm_call(api) as c:
        if engine_id is not None:
            engine: dict[str, Any] = c.get(f"/v1/engines/{engine_id}")
        else:
            assert model is not None
            engine = c.resolve(model, machine, version=version, allow_cpu=allow_cpu)["engine"]
        record = c.get(f"/v1/models/{engine['model_id']}")
        farm = c.measurements(engine["id"], source="farm")["items"]
        need(extra_for(engine["target"]))
        path, _ = c.cached(engine, cache)
        reference, unchecked = _reference(c, engine, cache.root) if check else (None, "--no-check")
    from enginefarm.measure import device

    info = ModelInfo(
        inputs=[TensorInfo(**t) for t in record["inputs"]],
        outputs=[TensorInfo(**t) for t in record["outputs"]],
        opset=record["opset"],
        ir_version=record["ir_version"],
        producer=record["producer"],
        size=record["size"],
        has_qdq=record["has_qdq"],
    )
    at = next((m for m in farm if m["shape_key"] == DEFAULT_SHAPE_KEY), None)
    try:
        timing_at, origin = device.timing_shapes(engine, info, at["shapes"] if at else None, given)
        runner, runtime, runtime_version = device.runner_for(engine, path, threads)
        try:
            timed = device.run(runner, info, timing_at, bench, seed=0)
            checked = device.check(runner, reference[0], reference[1]) if reference else None
        finally:
            runner.close()
        batch = next(iter(timing_at.values()), [1])[0] if timing_at else 1
        figure = device.figure(
            timed, machine, device.machine_id(cache.root), (runtime, runtime_version), timing_at, batch
        )
        figure.accuracy = checked
    except Exception as exc:  # noqa: BLE001 - a runtime's own error types: each ends the command with its line
        fail(exc)
    recorded = None
    if post:
        with farm_call(api) as c:
            recorded = c.post_measurement(engine["id"], figure)
    _report(engine, figure, origin, at, recorded, as_json, unchecked)


def _reference(c: Any, engine: dict[str, Any], folder: Path) -> tuple[tuple[Path, dict[str, Any]] | None, str]:
    """The farm's reference outputs for the engine, downloaded (verified) into the cache folder, or why not."""
    from enginefarm.client.errors import ApiError

    dest = folder / "references" / f"engine-{engine['id']}.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        return (dest, c.download_reference(engine["id"], dest)), ""
    except ApiError as exc:
        if exc.status_code != 404:
            raise
        return None, str(exc.message).removeprefix(f"HTTP {exc.status_code}: ")


def _report(
    engine: dict[str, Any],
    figure: Any,
    origin: str,
    farm: dict[str, Any] | None,
    recorded: Any,
    as_json: bool,
    unchecked: str,
) -> None:
    if as_json:
        said = {
            "engine": engine,
            "measurement": figure.model_dump(mode="json"),
            "farm": farm,
            "recorded": recorded,
            "unchecked": unchecked or None,
        }
        console.print_json(json.dumps(said))
        return
    shapes = ", ".join(f"{n}:{'x'.join(map(str, d))}" for n, d in figure.shapes.items())
    console.print(
        f"engine {engine['id']} ({engine['target']} {engine['precision']}) on {figure.runtime} "
        f"{figure.runtime_version}: median {figure.median_ms:.3g} ms, p99 {figure.p99_ms:.3g} ms at {shapes} "
        f"({origin})",
        highlight=False,
    )
    if figure.accuracy is not None:
        a = figure.accuracy
        worst = min((f["cosine"] for f in a.outputs.values() if "cosine" in f), default=None)
        verdict = "passed" if a.passed else "FAILED"
        console.print(
            f"accuracy {verdict} against the farm's fp32 reference outputs ({a.inputs})"
            + (f", worst cosine {worst:.6f}" if worst is not None else ""),
            highlight=False,
        )
    else:
        err.print(f"accuracy not checked: {unchecked}", highlight=False)
    if farm:
        where = farm["gpu_name"] or farm["cpu_name"] or "its worker"
        console.print(f"the farm measured it at {farm['median_ms']:.3g} ms on {where}", highlight=False)
    if recorded:
        flag = " (flagged: far off the other machines of its class)" if recorded["flagged"] else ""
        console.print(f"posted as measurement {recorded['id']} of machine {figure.machine_id}{flag}", highlight=False)
    else:
        err.print("not posted (--no-post)")


def register(root: typer.Typer) -> None:
    """Add ``measure`` to the ``enginefarm`` command."""
    if not any(c.name == "measure" for c in root.registered_commands):
        root.command("measure")(measure)
