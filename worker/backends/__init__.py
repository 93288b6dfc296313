"""Build backends, one file each: tensorrt, tensorrt-rtx, onnxruntime."""

from __future__ import annotations

import importlib

from enginefarm.core.domain import Backend
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


__all__ = ["BuildBackend", "BuildLog", "get_backend"]
