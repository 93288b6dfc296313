"""ONNX Runtime on the CPU: an offline graph-optimized model for the worker's CPU architecture.

It is both the CPU target and the numeric reference for the accuracy checks.
"""

from __future__ import annotations

from pathlib import Path

from enginefarm.domain import Backend, BuildSpec, EngineDescriptor, Target
from enginefarm.errors import BuildFailed, TargetUnavailable
from worker.backends.base import BuildBackend, BuildLog
from worker.backends.trt_common import load_module
from worker.probe import MachineProbe


class OnnxRuntimeBackend(BuildBackend):
    backend = Backend.ONNXRUNTIME

    def version(self) -> str:
        return load_module("onnxruntime").__version__

    def build(self, model_path: Path, spec: BuildSpec, target: Target, out_path: Path, log: BuildLog,
              machine: MachineProbe | None) -> EngineDescriptor:
        ort = load_module("onnxruntime")
        if target.arch != f"cpu-{self.host_platform()}":
            # ORT_ENABLE_ALL applies layout transforms for the CPU it runs on: build on the target's arch.
            raise TargetUnavailable(f"{target}: this worker's CPU is {self.host_platform()}")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(out_path)
        try:
            ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types: all are model errors here
            raise BuildFailed(f"ONNX Runtime could not load the model: {exc}") from exc
        log.add(f"onnxruntime {ort.__version__}: graph optimized for {self.host_platform()} (ORT_ENABLE_ALL)")
        return EngineDescriptor(
            target=str(target), backend=self.backend.value, backend_version=ort.__version__,
            precision=spec.precision.value, platform=self.host_platform(),
        )
