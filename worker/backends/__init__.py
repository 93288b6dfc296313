"""Build backends, one file each: tensorrt, tensorrt-rtx, onnxruntime."""

from __future__ import annotations

from enginefarm.domain import Backend
from worker.backends.base import BuildBackend, BuildLog


def get_backend(backend: Backend) -> BuildBackend:
    from enginefarm.config import get_settings

    impl = _backend(backend)
    if get_settings().test_backends:  # the test suite's slow build (tests/slow_backend.py); never set in service
        from tests.slow_backend import SlowBackend

        impl = SlowBackend(impl)
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
