"""ONNX Runtime on the CPU: an offline graph-optimized model for the worker's CPU architecture.

It is both the CPU target and the numeric reference for the accuracy checks.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from enginefarm.domain import Backend, EngineDescriptor, Target
from enginefarm.spec import BuildSpec, Precision
from enginefarm.errors import BuildFailed, TargetUnavailable
from enginefarm.worker.backends.base import BuildBackend, BuildLog
from enginefarm.worker.backends.trt_common import fp16_graph, load_module
from enginefarm.probe import MachineProbe


@lru_cache
def cpu_has_vnni() -> bool:
    """Whether the CPU has VNNI int8 dot products (x86); other architectures are not affected."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "vnni" in flags or not any(f in flags for f in (" avx2", " avx512"))


def has_qdq(model_path: Path) -> bool:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def optimization_level(ort, model_path: Path) -> tuple[object, str]:
    """The graph optimization level for this model on this CPU, and why. ONNX Runtime fuses Q/DQ pairs into
    integer kernels (QLinearConv, …) from ORT_ENABLE_EXTENDED up; on x86 CPUs with AVX2/AVX-512 but no VNNI
    those kernels saturate their u8·s8 products (measured: rel L2 0.105 against FP32 instead of 0.020 on a
    small conv net). There a Q/DQ model keeps the basic level, which runs the Q/DQ arithmetic exactly."""
    levels = ort.GraphOptimizationLevel
    if not cpu_has_vnni() and has_qdq(model_path):
        return levels.ORT_ENABLE_BASIC, "ORT_ENABLE_BASIC: Q/DQ model on a CPU without VNNI, fused int8 kernels would saturate"
    return levels.ORT_ENABLE_ALL, "ORT_ENABLE_ALL"


class OnnxRuntimeBackend(BuildBackend):
    backend = Backend.ONNXRUNTIME

    def version(self) -> str:
        return load_module("onnxruntime").__version__

    def build(self, model_path: Path, spec: BuildSpec, target: Target, out_path: Path, log: BuildLog,
              machine: MachineProbe | None) -> EngineDescriptor:
        if target.is_ort_cuda:  # the CUDA provider's graph: worker/backends/onnxruntime_cuda.py
            from enginefarm.worker.backends.onnxruntime_cuda import build_cuda

            return build_cuda(model_path, spec, target, out_path, log, machine)
        ort = load_module("onnxruntime")
        if target.arch != f"cpu-{self.host_platform()}":
            # ORT_ENABLE_ALL applies layout transforms for the CPU it runs on: build on the target's arch.
            raise TargetUnavailable(f"{target}: this worker's CPU is {self.host_platform()}")
        if spec.precision is Precision.FP16:
            model_path = fp16_graph(model_path, spec, out_path.parent, log)
        options = ort.SessionOptions()
        options.graph_optimization_level, why = optimization_level(ort, model_path)
        options.optimized_model_filepath = str(out_path)
        try:
            ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types: all are model errors here
            raise BuildFailed(f"ONNX Runtime could not load the model: {exc}") from exc
        log.add(f"onnxruntime {ort.__version__}: graph optimized for {self.host_platform()} ({why})")
        return EngineDescriptor(
            target=str(target), backend=self.backend.value, backend_version=ort.__version__,
            precision=spec.precision.value, platform=self.host_platform(),
        )
