"""The CUDA driver API for the worker's GPU work: checked ``cuda.bindings`` calls (``cu``, ``check``, ``CudaError``),
the device with its primary context (``CudaDevice``), device and pinned host memory, streams and timing events.

Every call goes through the driver API of ``cuda.bindings`` (imported lazily: a worker without a driver gets
``BackendMissing``), on the device's primary context, which the CUDA runtime, TensorRT and PyTorch share. The context
is made current on the calling thread only: create and use a ``CudaDevice`` and what hangs off it on one thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from enginefarm.core.errors import BackendMissing, EnginefarmError


class CudaError(EnginefarmError):
    """A CUDA (or NVRTC) call returned an error; the message names the call and the result code."""

    def __init__(self, call: str, result: Any, detail: str = ""):
        name = getattr(result, "name", str(result))
        super().__init__(f"{call} failed: {name}{f' ({detail})' if detail else ''}", call=call, result=name)
        self.call = call
        self.result = result


def driver() -> ModuleType:
    """``cuda.bindings.driver``, or ``BackendMissing`` where it is not importable."""
    try:
        from cuda.bindings import driver as bindings
    except ImportError as exc:
        raise BackendMissing(f"cuda-bindings is not importable on this machine: {exc}") from exc
    module: ModuleType = bindings
    return module


def check(call: str, result: tuple[Any, ...]) -> Any:
    """Unpack a ``cuda.bindings`` result ``(err, *values)``: raise ``CudaError`` unless err is success (0),
    else return nothing, the one value, or the tuple of values."""
    err, *values = result
    if int(err) != 0:
        raise CudaError(call, err, _describe(err))
    return None if not values else values[0] if len(values) == 1 else tuple(values)


def _describe(err: Any) -> str:
    """The driver's words for a CUresult ("out of memory"); best effort, as the error is what matters."""
    if type(err).__name__ != "CUresult":
        return ""
    try:
        got, text = driver().cuGetErrorString(err)
    except Exception:  # noqa: BLE001 - no driver library to ask
        return ""
    return text.decode(errors="replace") if int(got) == 0 and text else ""


def cu(call: str, *args: Any) -> Any:
    """Call the driver function named ``call`` and ``check`` its result, so every error names its call."""
    return check(call, getattr(driver(), call)(*args))


def cuda_init() -> None:
    """cuInit, turning "no driver library" and "no GPU" into ``BackendMissing``."""
    drv = driver()
    try:
        (err,) = drv.cuInit(0)
    except (RuntimeError, OSError) as exc:  # cuda.pathfinder's DynamicLibNotFoundError is a RuntimeError
        raise BackendMissing(f"no CUDA driver on this worker: {exc}") from exc
    if err in (
        drv.CUresult.CUDA_ERROR_NO_DEVICE,
        drv.CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        drv.CUresult.CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    ):
        raise BackendMissing(f"no usable CUDA GPU on this worker: cuInit returned {err.name}")
    check("cuInit", (err,))


# --------------------------------------------------------------------------- device and context


class CudaDevice:
    """One GPU with its primary context current on this thread; ``close()`` (or ``with``) releases it."""

    def __init__(self, index: int = 0):
        cuda_init()
        count = cu("cuDeviceGetCount")
        if not 0 <= index < count:
            raise BackendMissing(f"no CUDA GPU {index} on this worker (it has {count})")
        self.index = index
        self.device = cu("cuDeviceGet", index)
        self.context = cu("cuDevicePrimaryCtxRetain", self.device)
        self._open = True
        cu("cuCtxSetCurrent", self.context)

    @property
    def name(self) -> str:
        name: bytes = cu("cuDeviceGetName", 256, self.device)
        return name.split(b"\0", 1)[0].decode(errors="replace")

    def attribute(self, name: str) -> int:
        """A ``CU_DEVICE_ATTRIBUTE_*`` value, e.g. ``attribute("MULTIPROCESSOR_COUNT")``."""
        attr = getattr(driver().CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(cu("cuDeviceGetAttribute", attr, self.device))

    @property
    def compute_capability(self) -> str:
        return f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}.{self.attribute('COMPUTE_CAPABILITY_MINOR')}"

    @property
    def pci_bus_id(self) -> str:
        """ "0000:19:00.0": how NVML finds the same GPU whatever CUDA_VISIBLE_DEVICES renumbered."""
        bus: bytes = cu("cuDeviceGetPCIBusId", 32, self.device)
        return bus.split(b"\0", 1)[0].decode()

    @staticmethod
    def driver_cuda_version() -> str:
        """The CUDA version the driver supports: 13000 → "13.0"."""
        v = int(cu("cuDriverGetVersion"))
        return f"{v // 1000}.{v % 1000 // 10}"

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as the driver sees it (other processes included)."""
        free, total = cu("cuMemGetInfo")
        return int(free), int(total)

    def synchronize(self) -> None:
        cu("cuCtxSynchronize")

    def close(self) -> None:
        if self._open:
            self._open = False
            cu("cuDevicePrimaryCtxRelease", self.device)

    def __enter__(self) -> CudaDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- memory, streams, events


class DeviceBuffer:
    """``nbytes`` of device memory (cuMemAlloc); ``ptr`` is the address to hand to kernels and engines."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = int(cu("cuMemAlloc", max(nbytes, 1)))  # cuMemAlloc refuses 0 bytes

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            cu("cuMemFree", ptr)


class PinnedArray:
    """A numpy array in page-locked host memory (cuMemHostAlloc), so async copies really run async.

    ``array`` is a view of that memory: do not use it (or views of it) after ``close()``.
    """

    def __init__(self, shape: Sequence[int], dtype: DTypeLike):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.ptr = int(cu("cuMemHostAlloc", max(self.nbytes, 1), 0))
        raw = np.ctypeslib.as_array(ctypes.cast(self.ptr, ctypes.POINTER(ctypes.c_ubyte)), shape=(max(self.nbytes, 1),))
        self.array: np.ndarray = raw[: self.nbytes].view(self.dtype).reshape(self.shape)

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            cu("cuMemFreeHost", ptr)


class Stream:
    """A non-blocking stream: it does not wait for work on the legacy default stream, and it can be captured."""

    def __init__(self) -> None:
        self.stream = cu("cuStreamCreate", driver().CUstream_flags.CU_STREAM_NON_BLOCKING)

    @property
    def handle(self) -> int:
        """The raw cudaStream_t, as ``execute_async_v3`` and ``torch.cuda.ExternalStream`` take it."""
        return int(self.stream)

    def synchronize(self) -> None:
        cu("cuStreamSynchronize", self.stream)

    def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            cu("cuStreamDestroy", stream)


class Event:
    """A timing event (the default flags keep timing on)."""

    def __init__(self) -> None:
        self.event = cu("cuEventCreate", driver().CUevent_flags.CU_EVENT_DEFAULT)

    def record(self, stream: Stream) -> None:
        cu("cuEventRecord", self.event, stream.stream)

    def close(self) -> None:
        if self.event is not None:
            event, self.event = self.event, None
            cu("cuEventDestroy", event)


def elapsed_ms(start: Event, end: Event) -> float:
    """GPU time from ``start`` to ``end`` in ms (resolution about 0.5 µs); both must have completed."""
    return float(cu("cuEventElapsedTime", start.event, end.event))
