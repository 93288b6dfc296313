"""Build backends, one file each: tensorrt, tensorrt-rtx, onnxruntime."""

from __future__ import annotations

import importlib
from pathlib import Path

from enginefarm.core.domain import Backend, Target
from enginefarm.core.spec import BuildSpec, Precision
from worker.backends.base import BuildBackend, BuildLog


def get_backend(backend: Backend) -> BuildBackend:
    from enginefarm.core.config import get_settings

    impl = _backend(backend)
    if wrapper := get_settings().backend_wrapper:  # ENGINEFARM_BACKEND_WRAPPER="module:Class"
        module, _, name = wrapper.partition(":")
        impl = getattr(importlib.import_module(module), name)(impl)
    return impl


def _backend(backend: Backend) -> BuildBackend:
    if backend is Backend.TENSORRT:
        from worker.backends.tensorrt import TensorRTBackend

        return TensorRTBackend()
    if backend is Backend.TENSORRT_RTX:
        from worker.backends.tensorrt_rtx import TensorRTRTXBackend

        return TensorRTRTXBackend()
    from worker.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def cpu_target() -> Target:
    """This worker's ONNX Runtime CPU target."""
    return Target.parse(f"onnxruntime/cpu-{get_backend(Backend.ONNXRUNTIME).host_platform()}")


def ort_artifact(
    model: Path, spec: BuildSpec, out: Path, precision: Precision | None = None, target: Target | None = None
) -> Path:
    """``model`` built into ``out`` by the ONNX Runtime backend, as a build task builds it, at ``precision`` (default:
    the spec's) for ``target`` (default: this worker's CPU); returns ``out``."""
    if precision is not None:
        spec = spec.model_copy(update={"precision": precision})
    out.parent.mkdir(parents=True, exist_ok=True)
    get_backend(Backend.ONNXRUNTIME).build(model, spec, target or cpu_target(), out, BuildLog(), None)
    return out


__all__ = ["BuildBackend", "BuildLog", "cpu_target", "get_backend", "ort_artifact"]
