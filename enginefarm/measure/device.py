"""A deploy machine measures an engine the farm handed it: the runner its target needs, the shapes the farm measured
at, the farm's inputs and trtexec rules, and the figure as the farm takes it (``enginefarm.core.fleet.Measurement``).
``enginefarm measure`` (``cli``) fetches the engine and posts the figure; this module only runs it."""

from __future__ import annotations

import math
import re
import secrets
from pathlib import Path
from typing import Any

from enginefarm.core.domain import BACKEND_MODULES, Backend, ModelInfo
from enginefarm.core.fleet import Accuracy, Measurement
from enginefarm.core.machine import Machine
from enginefarm.core.spec import BenchmarkSpec, BuildSpec
from enginefarm.core.stats import Measurement as Timing
from enginefarm.measure.check import Reference, verdict
from enginefarm.measure.inputs import random_inputs
from enginefarm.measure.modules import load_module

LARGEST = 1e300  # what a figure that is not finite is sent as
MACHINE_ID_FILE = "machine-id"
MACHINE_ID = r"[A-Za-z0-9_-]{8,64}"  # what the farm takes (enginefarm.core.fleet.Measurement.machine_id)


def machine_id(folder: Path) -> str:
    """This machine's stable anonymous id: made once (random, naming no host or user) and kept in ``folder`` (the
    client's cache folder), so every post from this machine counts as the same machine."""
    path = folder / MACHINE_ID_FILE
    try:
        found = path.read_text().strip()
        if re.fullmatch(MACHINE_ID, found):
            return found
    except OSError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    made = secrets.token_hex(16)
    path.write_text(made + "\n")
    return made


def runner_for(engine: dict[str, Any], path: Path, threads: int | None) -> tuple[Any, str, str]:
    """The runner of this engine's target on this machine, what the farm calls that runtime, and its version."""
    target = engine["target"]
    if target.startswith("onnxruntime/cpu-"):
        from enginefarm.measure.ort_runner import OrtRunner

        cpu = OrtRunner(path, threads)
        return cpu, "onnxruntime/CPUExecutionProvider", cpu.ort.__version__
    if target.startswith("onnxruntime/cuda-"):
        from enginefarm.measure.ort_cuda_runner import OrtCudaRunner, SessionChoice

        # With the provider options the farm's GPU worker measured fastest for it, as a deploy machine loads it.
        cuda = OrtCudaRunner(path, tf32=BuildSpec().tf32, choice=SessionChoice.of(engine.get("run_options")))
        return cuda, "onnxruntime/CUDAExecutionProvider", cuda.ort.__version__
    from enginefarm.measure.trt_runner import TensorRTEngineRunner

    module = load_module(BACKEND_MODULES[Backend(engine["backend"])])
    return TensorRTEngineRunner(path.read_bytes(), module), engine["backend"], str(module.__version__)


def timing_shapes(
    engine: dict[str, Any], info: ModelInfo, farm_shapes: dict[str, list[int]] | None, given: dict[str, list[int]]
) -> tuple[dict[str, list[int]], str]:
    """The input shapes to time at, and where they came from: those given, else those the farm's own benchmark of
    this engine ran at (so the two figures compare), else the engine's first profile's opt shapes, else the
    model's static dims. A ValueError names an input whose dims are still not known."""
    if given:
        origin, shapes = "--shapes", dict(given)
    elif farm_shapes:
        origin, shapes = "the farm's own benchmark of this engine", dict(farm_shapes)
    elif engine.get("profiles"):
        origin = "the opt shapes of the engine's profile"
        shapes = {name: list(r["opt"]) for name, r in engine["profiles"][0].items()}
    else:
        origin, shapes = "the model's static dims", {}
    for tensor in info.inputs:
        if tensor.name not in shapes:
            if tensor.dynamic_axes:
                raise ValueError(
                    f"input {tensor.name!r} has dynamic dims {tensor.dims}: give its shape with --shapes "
                    f"{tensor.name}:<dims>, e.g. 1x3x224x224"
                )
            shapes[tensor.name] = [int(d) for d in tensor.dims if isinstance(d, int)]
    return shapes, origin


def run(runner: Any, info: ModelInfo, shapes: dict[str, list[int]], bench: BenchmarkSpec, seed: int) -> Timing:
    """Time the engine at these shapes by the farm's trtexec rules, with the farm's generated inputs."""
    inputs = random_inputs(info, shapes, seed, bench.value_ranges)
    timed: Timing = runner.benchmark(inputs, bench)
    return timed


def check(runner: Any, reference_file: Path, record: dict[str, Any]) -> Accuracy:
    """The engine's accuracy check here, against the farm's reference outputs (``record``: the farm's answer for
    them, with the limits of the engine's precision), by the farm's own gate and code. Figures that are not finite
    (an engine that answered NaN) are sent as the largest the farm takes: the verdict fails either way."""
    ref = Reference.load(reference_file)
    limits = {str(k): float(v) for k, v in record["limits"].items()}
    result = verdict(runner, ref, limits, str(record["precision"]))
    tf32 = result.get("tf32") or {}
    return Accuracy(
        passed=bool(result["pass"]),
        outputs=_figures(result["outputs"]),
        without_tf32=_figures(tf32["outputs_without_tf32"]) if tf32.get("explains") else None,
        inputs=ref.origin[:500],
        reference=record["sha256"],
    )


def _figures(outputs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {
        name: {k: _finite(v) for k, v in figures.items() if isinstance(v, (int, float)) or _is_inf_text(v)}
        for name, figures in outputs.items()
    }


def _is_inf_text(v: object) -> bool:
    return isinstance(v, str) and v in ("inf", "-inf", "nan")


def _finite(v: float | str) -> float:
    value = float(v)
    return value if math.isfinite(value) else (-LARGEST if value < 0 else LARGEST)


def figure(
    timed: Timing,
    machine: Machine,
    machine_id: str,
    runtime: tuple[str, str],
    shapes: dict[str, list[int]],
    batch: int,
) -> Measurement:
    """The figure to post: the end-to-end median and p99, throughput, and every statistic, checked by the farm's
    type before it leaves (a figure the farm would refuse is refused here)."""
    stats = timed.summary(batch)
    e2e = stats["e2e"]
    numbers = {
        k: float(v)
        for k, v in e2e.items()
        if isinstance(v, (int, float)) and k != "count" and math.isfinite(v) and v >= 0
    }
    return Measurement(
        machine_id=machine_id,
        machine=machine,
        runtime=runtime[0],
        runtime_version=runtime[1],
        shapes=shapes,
        median_ms=e2e["median"],
        p99_ms=e2e["p99"],
        throughput_qps=stats.get("throughput_qps"),
        stats={f"e2e_{k}_ms": v for k, v in numbers.items()} | {"iterations": float(stats["iterations"])},
    )
