"""ONNX Runtime with its CUDA execution provider: the prepared graph for ``onnxruntime/cuda-smXY``.

The artifact is an ONNX graph, not GPU code: the farm's own fp16 conversion (worker/rewrite/fp16) or int8 stage (the
Q/DQ model worker/int8/stage.py made) gives the precision, and ONNX Runtime's graph optimizations up to the extended
level, run with the CUDA provider, are saved into it, so a deploy machine loads it without redoing them. The
extended level fuses operators the CUDA provider has kernels for and applies no layout change for one CPU (the
``all`` level's NCHWc), so the graph stays portable across GPUs; the build still runs on a GPU of the target's
compute capability, because that is where its benchmark and accuracy figures are measured and where the provider
proves it can run the graph."""

from __future__ import annotations

from pathlib import Path

from enginefarm.core.domain import Backend, EngineDescriptor, Target
from enginefarm.core.errors import BuildFailed, TargetUnavailable
from enginefarm.core.ortcuda import ORT_CUDA_PROVIDER
from enginefarm.core.probe.gpus import GpuInfo
from enginefarm.core.probe.machineprobe import MachineProbe, probe_machine
from enginefarm.core.spec import BuildSpec, Precision
from enginefarm.measure.modules import load_module
from enginefarm.measure.ort_cuda_runner import cuda_provider_options, runtime_facts
from worker.backends.base import BuildLog
from worker.backends.trt_common import fp16_graph

# What the saved graph was optimized at (see the module's docstring).
SAVED_LEVEL = "ORT_ENABLE_EXTENDED"


def gpu_for(target: Target, probe: MachineProbe) -> GpuInfo:
    """The local GPU of the target's compute capability; TargetUnavailable saying why there is none."""
    if not probe.ort_cuda:
        raise TargetUnavailable(
            f"{target}: ONNX Runtime's CUDA provider is not usable on this worker: "
            f"{probe.ort_cuda_error or 'not probed'}"
        )
    gpu = next((g for g in probe.gpus if g.compute_capability == target.compute_capability), None)
    if gpu is None:
        have = ", ".join(f"{g.name} ({g.compute_capability})" for g in probe.gpus) or "none"
        raise TargetUnavailable(
            f"{target}: this worker has no GPU of compute capability {target.compute_capability} (it has {have})"
        )
    return gpu


def build_cuda(
    model_path: Path, spec: BuildSpec, target: Target, out_path: Path, log: BuildLog, machine: MachineProbe | None
) -> EngineDescriptor:
    """Save the graph for ``target`` into ``out_path``, optimized by ONNX Runtime with the CUDA provider."""
    ort = load_module("onnxruntime")
    probe = machine if machine is not None and machine.ort_cuda else probe_machine()
    gpu = gpu_for(target, probe)
    if spec.precision is Precision.FP16:
        model_path = fp16_graph(model_path, spec, out_path.parent, log)
    elif spec.precision is Precision.INT8:
        log.add("int8: the Q/DQ graph runs as quantize, dequantize and float kernels on the CUDA provider")
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, SAVED_LEVEL)
    options.optimized_model_filepath = str(out_path)
    provider = cuda_provider_options(spec.tf32, gpu.index)
    try:
        session = ort.InferenceSession(str(model_path), options, providers=[(ORT_CUDA_PROVIDER, provider)])
    except Exception as exc:  # ORT's own Fail/InvalidGraph/RuntimeException types: the model does not load
        raise BuildFailed(f"ONNX Runtime (CUDA) could not load the model: {exc}") from exc
    if ORT_CUDA_PROVIDER not in session.get_providers():
        raise TargetUnavailable(f"{target}: ONNX Runtime fell back to the CPU ({', '.join(session.get_providers())})")
    del session
    facts = runtime_facts(
        probe,
        gpu,
        {"graph_optimization_level": SAVED_LEVEL, "providers": [ORT_CUDA_PROVIDER], "provider_options": provider},
    )
    log.add(
        f"onnxruntime {ort.__version__} CUDA: graph optimized ({SAVED_LEVEL}) on {gpu.name} "
        f"(compute capability {gpu.compute_capability}), CUDA {facts['cuda']}, cuDNN {facts['cudnn']}, "
        f"driver {facts['driver']}"
    )
    log.add(f"session options: {facts['session']}")
    return EngineDescriptor(
        target=str(target),
        backend=Backend.ONNXRUNTIME.value,
        backend_version=ort.__version__,
        precision=spec.precision.value,
        platform=probe.platform,
        compute_capability=gpu.compute_capability,
        compute_capabilities=[gpu.compute_capability],
        gpu_name=gpu.name,
        cuda_version=None if facts["cuda"] == "unknown" else facts["cuda"],
        driver_version=probe.driver_version,
    )
