"""The benchmark stage: time an engine at each shape the spec asks for, then check its outputs against
ONNX Runtime FP32 on the original model. No Celery here (worker/tasks.py wraps it).

An engine is run by a runner: ONNX Runtime on the CPU for ``onnxruntime`` engines, the TensorRT runtime
through cuda-python (enginefarm/measure/gpu_timing.py) for ``tensorrt`` and ``tensorrt-rtx`` engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from enginefarm.core.domain import BACKEND_MODULES, Backend, ModelInfo, Target
from enginefarm.core.errors import BuildFailed
from enginefarm.core.spec import BuildSpec
from enginefarm.core.stats import Measurement
from enginefarm.graph.inputs import (
    ShapeSet,
    fixed_arrays,
    opt_shape_set,
    sample_batches,
    shape_sets,
    timing_inputs,
)
from enginefarm.measure import check
from enginefarm.measure.check import Reference
from enginefarm.measure.inputs import random_inputs
from enginefarm.measure.modules import load_module
from enginefarm.measure.ort_cuda_runner import OrtCudaRunner, SessionChoice
from enginefarm.measure.ort_runner import OrtRunner
from worker.measure import int8_vs_fp32


class Runner(Protocol):
    """Runs one engine: ``infer`` for the accuracy check, ``benchmark`` for the timing."""

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def benchmark(self, inputs: dict[str, np.ndarray], spec) -> Measurement: ...

    def close(self) -> None: ...


@dataclass
class Device:
    """Where a runner runs: the label reports print, and the GPU model benchmarks are keyed by (None: CPU)."""

    label: str
    gpu_name: str | None = None
    compute_capability: str | None = None


def make_runner(
    backend: str,
    engine_path: Path,
    spec: BuildSpec,
    gpu: dict | None,
    target: Target | None = None,
    choice: SessionChoice | None = None,
) -> tuple[Runner, Device]:
    """The runner for an engine of this backend (and target) on this worker, and the device it runs on. ``gpu``:
    the probe's GPU 0 (NVML's name, the one deploy fingerprints carry), else CUDA's own answer. ``choice``: an
    ``onnxruntime/cuda`` artifact's provider options (worker/measure/sessions.py)."""
    if target and target.is_ort_cuda:
        cuda = OrtCudaRunner(engine_path, tf32=spec.tf32, choice=choice or SessionChoice())
        return cuda, Device(cuda.label, cuda.gpu_name, cuda.compute_capability)
    if backend == Backend.ONNXRUNTIME.value:
        runner = OrtRunner(engine_path, spec.benchmark.threads)
        return runner, Device(runner.label)
    from enginefarm.measure.trt_runner import TensorRTEngineRunner

    trt = TensorRTEngineRunner(engine_path.read_bytes(), load_module(BACKEND_MODULES[Backend(backend)]))
    name = (gpu or {}).get("name") or trt.device.name
    return trt, Device(name, name, (gpu or {}).get("compute_capability") or trt.device.compute_capability)


# --------------------------------------------------------------------------- the stage


@dataclass
class ShapeResult:
    shape: ShapeSet
    stats: dict[str, Any]


@dataclass
class Evaluation:
    benchmarks: list[ShapeResult] = field(default_factory=list)
    accuracy: dict | None = None
    device_memory_bytes: int | None = None
    device: str = ""
    gpu_name: str | None = None
    compute_capability: str | None = None
    errors: list[str] = field(default_factory=list)  # what could not be measured, and why
    # An onnxruntime/cuda artifact's provider options kept by the session sweep (None: no sweep ran).
    run_options: dict[str, str] | None = None


def reference_session(model_path: Path):
    ort = load_module("onnxruntime")
    options = ort.SessionOptions()
    # The reference is the model as written: no graph rewrites that could move its numbers.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BuildFailed(f"ONNX Runtime could not load the reference model: {exc}") from exc


def accuracy_feeds(spec: BuildSpec, info: ModelInfo, samples: dict[str, np.ndarray] | None) -> tuple[list[dict], str]:
    """The inputs of the accuracy check and where they came from."""
    opt = opt_shape_set(spec, info)
    if samples:
        feeds = sample_batches(samples, info, opt.batch or 1)
        used = sum(len(next(iter(f.values()))) for f in feeds)
        return feeds, f"{used} user samples in {len(feeds)} batch(es)"
    ranges = spec.benchmark.value_ranges
    feeds = [random_inputs(info, opt.shapes, spec.accuracy.seed + i, ranges) for i in range(spec.accuracy.batches)]
    return feeds, f"{len(feeds)} batch(es) of seeded random inputs (seed {spec.accuracy.seed}) at {opt.key} shapes"


def accuracy_inputs(
    reference_model: Path, spec: BuildSpec, info: ModelInfo, samples: dict[str, np.ndarray] | None
) -> Reference:
    """The accuracy check's inputs and the reference's outputs on them (ONNX Runtime fp32 on ``reference_model``)."""
    feeds, origin = accuracy_feeds(spec, info, samples)
    fixed = fixed_arrays(spec, info)
    feeds = [{n: a for n, a in feed.items() if n not in fixed} for feed in feeds]
    return reference_outputs(reference_model, feeds, origin, fixed)


def reference_outputs(
    model: Path, feeds: list[dict[str, np.ndarray]], origin: str, fixed: dict[str, np.ndarray] | None = None
) -> Reference:
    """``feeds`` and ONNX Runtime fp32's outputs of ``model`` on them (each run with ``fixed`` added)."""
    session = reference_session(model)
    names = [o.name for o in session.get_outputs()]
    wanted = [dict(zip(names, session.run(names, {**feed, **(fixed or {})}))) for feed in feeds]
    return Reference(feeds, wanted, names, origin)


def compare(runner: Runner, inputs: Reference, limits: dict) -> dict:
    """The engine's outputs on the check's inputs against the reference's, judged under ``limits``."""
    try:
        return check.compare(runner, inputs, limits)
    except ValueError as exc:  # an output the engine lacks, shapes that differ
        raise BuildFailed(str(exc)) from exc


def check_accuracy(
    runner: Runner, reference_model: Path, spec: BuildSpec, info: ModelInfo, samples: dict[str, np.ndarray] | None
) -> dict:
    return judge_on(runner, accuracy_inputs(reference_model, spec, info, samples), spec)


def judge_on(runner: Runner, inputs: Reference, spec: BuildSpec) -> dict:
    """The check's verdict on the engine's outputs for ``inputs`` (computed once per stage)."""
    try:
        return check.verdict(runner, inputs, spec.accuracy.limits(spec.precision.value), spec.precision.value)
    except ValueError as exc:
        raise BuildFailed(str(exc)) from exc


def evaluate(
    engine_path: Path,
    backend: str,
    spec: BuildSpec,
    info: ModelInfo,
    reference_model: Path,
    samples: dict[str, np.ndarray] | None,
    gpu: dict | None = None,
    reraise: tuple[type[BaseException], ...] = (),
    target: Target | None = None,
    run_options: dict[str, str] | None = None,
) -> Evaluation:
    """Benchmark the engine at every shape set, then run the accuracy check; the caller stores the result.
    A shape that fails to run is recorded in ``errors`` with the reason, and the accuracy check still runs:
    one failure never hides the other figures. ``reraise``: exceptions that must end the stage (time limits).
    An ``onnxruntime/cuda`` artifact measured at its opt shape gets the session sweep first (worker/measure/
    sessions.py); measured only at other shapes, it runs with the options it was kept with (``run_options``)."""
    reference, reference_error = None, None
    if spec.accuracy.enabled:
        try:
            reference = accuracy_inputs(reference_model, spec, info, samples)
        except reraise:
            raise
        except Exception as exc:  # noqa: BLE001 - the reference model does not run: reported with the figures
            reference_error = f"accuracy check did not run: {_reason(exc)}"
    swept = None
    opt = opt_shape_set(spec, info)
    if target and target.is_ort_cuda and spec.benchmark.enabled and opt.key in {s.key for s in shape_sets(spec, info)}:
        from worker.measure import sessions

        swept = sessions.sweep(engine_path, spec, benchmark_inputs(spec, info, opt, samples)[0], reference, reraise)
    choice = swept.chosen if swept else SessionChoice.of(run_options)
    runner, device = make_runner(backend, engine_path, spec, gpu, target, choice)
    try:
        out = Evaluation(device=device.label, gpu_name=device.gpu_name, compute_capability=device.compute_capability)
        if swept is not None:
            out.run_options = swept.chosen.provider_options()
        if spec.benchmark.enabled:
            for shape in shape_sets(spec, info):
                _benchmark_shape(runner, device, backend, spec, info, shape, samples, out, reraise)
                if swept is not None and out.benchmarks and out.benchmarks[-1].shape.key == shape.key == opt.key:
                    out.benchmarks[-1].stats["sessions"] = swept.record()
            if int8_vs_fp32.applies(backend, spec):  # an int8 CPU artifact is timed against its fp32 sibling
                int8_vs_fp32.compare(
                    runner,
                    lambda p: OrtRunner(p, spec.benchmark.threads),
                    reference_model,
                    spec,
                    lambda shape: benchmark_inputs(spec, info, shape, samples)[0],
                    out.benchmarks,
                    reraise,
                )
        if reference_error:
            out.errors.append(reference_error)
        if reference is not None:
            try:
                out.accuracy = judge_on(runner, reference, spec)
            except reraise:
                raise
            except Exception as exc:  # noqa: BLE001 - the runner's own error types; all mean "did not run"
                out.errors.append(f"accuracy check did not run: {_reason(exc)}")
        return out
    finally:
        runner.close()


def _benchmark_shape(
    runner: Runner,
    device: Device,
    backend: str,
    spec: BuildSpec,
    info: ModelInfo,
    shape: ShapeSet,
    samples: dict[str, np.ndarray] | None,
    out: Evaluation,
    reraise: tuple[type[BaseException], ...],
) -> None:
    inputs, origin = benchmark_inputs(spec, info, shape, samples)
    try:
        measured = runner.benchmark(inputs, spec.benchmark)
    except reraise:
        raise
    except Exception as exc:  # noqa: BLE001
        out.errors.append(f"benchmark at {shape.key} ({_shapes_text(shape)}, {origin}) failed: {_reason(exc)}")
        return
    stats = measured.summary(shape.batch or 1)
    stats.update(
        device=device.label,
        shape_key=shape.key,
        inputs=origin,
        cuda_graph=measured.extra.get("cuda_graph", spec.benchmark.cuda_graph)
        if backend != Backend.ONNXRUNTIME.value or "cuda_graph" in measured.extra
        else None,
        settings=spec.benchmark.model_dump(mode="json", exclude={"shapes", "batch_sizes"}),
    )
    out.benchmarks.append(ShapeResult(shape, stats))
    # The largest shape's figure: what the memory rule must hold against a machine.
    out.device_memory_bytes = max(
        filter(None, (stats.get("device_memory_bytes"), out.device_memory_bytes)), default=None
    )


def benchmark_inputs(
    spec: BuildSpec, info: ModelInfo, shape: ShapeSet, samples: dict[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], str]:
    """What the benchmark stage feeds at ``shape``, and where it came from (fixed inputs: constants in the engine)."""
    inputs, origin = timing_inputs(
        info, shape, samples if spec.benchmark.use_samples else None, spec.accuracy.seed, spec.benchmark.value_ranges
    )
    return {n: a for n, a in inputs.items() if n not in spec.fixed_inputs}, origin


def _shapes_text(shape: ShapeSet) -> str:
    return ", ".join(f"{n}:{'x'.join(map(str, d))}" for n, d in shape.shapes.items())


def _reason(exc: BaseException) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
