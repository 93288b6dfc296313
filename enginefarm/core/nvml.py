"""An NVML session for the probe and the benchmark clocks. pynvml is imported lazily: a machine without
the driver (or without pynvml) gets NvmlUnavailable saying which, and nothing else is imported here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any


class NvmlUnavailable(Exception):
    """NVML cannot be used here: pynvml is missing (``during_init`` False) or NVML would not start."""

    def __init__(self, message: str, during_init: bool):
        super().__init__(message)
        self.during_init = during_init


@contextmanager
def nvml_session() -> Iterator[Any]:
    """pynvml, initialised, shut down on leaving; raises NvmlUnavailable saying why it cannot start."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"pynvml not importable ({exc})", during_init=False) from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound on machines without a driver
        raise NvmlUnavailable(str(exc) or type(exc).__name__, during_init=True) from exc
    try:
        yield pynvml
    finally:
        with suppress(Exception):  # shutting down is best effort
            pynvml.nvmlShutdown()
