"""Build backends, one file each: tensorrt, tensorrt-rtx, onnxruntime."""

from __future__ import annotations

from enginefarm.domain import Backend
from worker.backends.base import BuildBackend, BuildLog


def get_backend(backend: Backend) -> BuildBackend:
    if backend is Backend.TENSORRT:
        from worker.backends.tensorrt import TensorRTBackend

        return TensorRTBackend()
    if backend is Backend.TENSORRT_RTX:
        from worker.backends.tensorrt_rtx import TensorRTRTXBackend

        return TensorRTRTXBackend()
    from worker.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


__all__ = ["BuildBackend", "BuildLog", "get_backend"]
