"""GPU timing for engine benchmarks: CUDA events around the copies and the compute of one inference.

The benchmark stage times an engine the way trtexec does: inputs are copied host→device from pinned
memory, the engine is enqueued, outputs are copied back, all on one stream, with a CUDA event between
phases. The GPU's own clock then says how long each phase took, free of Python's and the driver's
launch overhead. ``stats.measure`` drives the loop (trtexec's 200 ms warm-up, at least 3 s and 10
iterations) and ``stats.summarize`` reports trtexec's percentiles.

Everything here is engine-agnostic (``TimedPipeline`` times any ``enqueue_compute(stream_handle)``); the
TensorRT engine that runs inside it is ``enginefarm.worker.trt_runner``. bench/gpu_timing.py proves this part
on a real GPU with a hand-written kernel in place of ``execute_async_v3``.

All CUDA work goes through the driver API of ``cuda.bindings`` (imported lazily: a worker without a
driver gets ``BackendMissing``), on the device's primary context, which the CUDA runtime, TensorRT and
PyTorch share. The context is made current on the calling thread only: create and use a ``CudaDevice``
and what hangs off it on one thread.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from enginefarm.core import stats
from enginefarm.core.errors import BackendMissing, EnginefarmError
from enginefarm.core.nvml import NvmlUnavailable, nvml_session


class CudaError(EnginefarmError):
    """A CUDA (or NVRTC) call returned an error; the message names the call and the result code."""

    def __init__(self, call: str, result: Any, detail: str = ""):
        name = getattr(result, "name", str(result))
        super().__init__(f"{call} failed: {name}{f' ({detail})' if detail else ''}", call=call, result=name)
        self.call = call
        self.result = result


def _driver() -> ModuleType:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise BackendMissing(f"cuda-bindings is not importable on this worker: {exc}") from exc
    return driver


def check(call: str, result: tuple) -> Any:
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
        got, text = _driver().cuGetErrorString(err)
    except Exception:  # noqa: BLE001 - no driver library to ask
        return ""
    return text.decode(errors="replace") if int(got) == 0 and text else ""


def cu(call: str, *args: Any) -> Any:
    """Call the driver function named ``call`` and ``check`` its result, so every error names its call."""
    return check(call, getattr(_driver(), call)(*args))


def cuda_init() -> None:
    """cuInit, turning "no driver library" and "no GPU" into ``BackendMissing``."""
    drv = _driver()
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
        return cu("cuDeviceGetName", 256, self.device).split(b"\0", 1)[0].decode(errors="replace")

    def attribute(self, name: str) -> int:
        """A ``CU_DEVICE_ATTRIBUTE_*`` value, e.g. ``attribute("MULTIPROCESSOR_COUNT")``."""
        attr = getattr(_driver().CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(cu("cuDeviceGetAttribute", attr, self.device))

    @property
    def compute_capability(self) -> str:
        return f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}.{self.attribute('COMPUTE_CAPABILITY_MINOR')}"

    @property
    def pci_bus_id(self) -> str:
        """ "0000:19:00.0": how NVML finds the same GPU whatever CUDA_VISIBLE_DEVICES renumbered."""
        return cu("cuDeviceGetPCIBusId", 32, self.device).split(b"\0", 1)[0].decode()

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


def gpu_clocks(index: int = 0, *, pci_bus_id: str | None = None) -> dict[str, Any]:
    """Current and maximum SM, memory and graphics clocks (MHz), temperature (°C) and power (W) via NVML.

    A benchmark is only comparable with another at the same clocks, so they go with every result. The GPU
    is found by ``pci_bus_id`` when given (CUDA and NVML may number GPUs differently), else by NVML index.
    Never raises: without NVML the dict holds only "error"; a reading the GPU does not support is left out
    and named under "error".
    """
    out: dict[str, Any] = {}
    errors: list[str] = []
    try:
        with nvml_session() as pynvml:
            handle = (
                pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
                if pci_bus_id
                else pynvml.nvmlDeviceGetHandleByIndex(index)
            )
            readings: dict[str, Callable[[], Any]] = {}
            for key, clock in (
                ("sm", pynvml.NVML_CLOCK_SM),
                ("memory", pynvml.NVML_CLOCK_MEM),
                ("graphics", pynvml.NVML_CLOCK_GRAPHICS),
            ):
                readings[f"{key}_mhz"] = lambda c=clock: pynvml.nvmlDeviceGetClockInfo(handle, c)
                readings[f"{key}_max_mhz"] = lambda c=clock: pynvml.nvmlDeviceGetMaxClockInfo(handle, c)
            readings["temperature_c"] = lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
            readings["power_w"] = lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
            for key, read in readings.items():
                try:
                    out[key] = read()
                except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported on some boards and in some VMs
                    errors.append(f"{key}: {exc or type(exc).__name__}")
    except NvmlUnavailable as exc:  # NVMLError_LibraryNotFound where there is no driver
        return {"error": f"NVML: {exc}" if exc.during_init else str(exc)}
    except Exception as exc:  # noqa: BLE001 - one failed NVML query is reported, the rest goes on
        errors.append(str(exc) or type(exc).__name__)
    if errors:
        out["error"] = "; ".join(errors)
    return out


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
        self.stream = cu("cuStreamCreate", _driver().CUstream_flags.CU_STREAM_NON_BLOCKING)

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
        self.event = cu("cuEventCreate", _driver().CUevent_flags.CU_EVENT_DEFAULT)

    def record(self, stream: Stream) -> None:
        cu("cuEventRecord", self.event, stream.stream)

    def close(self) -> None:
        if self.event is not None:
            event, self.event = self.event, None
            cu("cuEventDestroy", event)


def elapsed_ms(start: Event, end: Event) -> float:
    """GPU time from ``start`` to ``end`` in ms (resolution about 0.5 µs); both must have completed."""
    return float(cu("cuEventElapsedTime", start.event, end.event))


# --------------------------------------------------------------------------- the timed pipeline


def iteration_from_event_times(times: Sequence[float], *, h2d: bool = True, d2h: bool = True) -> stats.Iteration:
    """One ``Iteration`` from the GPU times (ms, any origin) of the four events of a step: before the
    host→device copies, after them (= before compute), after compute (= before the device→host copies),
    after those. e2e runs from the first event to the last. ``h2d``/``d2h`` False: nothing was copied
    that way, and the phase is None rather than a meaningless 0."""
    if len(times) != 4:
        raise ValueError(f"expected the times of 4 events, got {len(times)}")
    t0, t1, t2, t3 = (float(t) for t in times)
    if not t0 <= t1 <= t2 <= t3:
        raise ValueError(f"event times {list(times)} are not in stream order")
    return stats.Iteration(e2e=t3 - t0, compute=t2 - t1, h2d=t1 - t0 if h2d else None, d2h=t3 - t2 if d2h else None)


class TimedPipeline:
    """Copies in, compute, copies out on one stream, timed by four CUDA events per ``step()``.

    ``inputs`` are (device buffer, pinned host array) pairs copied host→device, ``outputs`` (pinned host
    array, device buffer) pairs copied device→host; ``enqueue_compute(stream_handle)`` enqueues the work
    (``execute_async_v3`` for an engine) and must not synchronize. With ``cuda_graph`` the compute is
    enqueued once for real (TensorRT does its lazy set-up there, and it must not happen under capture),
    then captured once and replayed each step with cuGraphLaunch, as trtexec's ``--useCudaGraph`` does;
    the copies stay outside the graph.
    """

    def __init__(
        self,
        inputs: Sequence[tuple[DeviceBuffer, PinnedArray]],
        enqueue_compute: Callable[[int], None],
        outputs: Sequence[tuple[PinnedArray, DeviceBuffer]],
        *,
        cuda_graph: bool = False,
    ):
        for dev, host in [*inputs, *((d, h) for h, d in outputs)]:
            if host.nbytes > dev.nbytes:
                raise ValueError(f"a {host.nbytes}-byte host array does not fit a {dev.nbytes}-byte device buffer")
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.enqueue_compute = enqueue_compute
        self.cuda_graph = cuda_graph
        self.stream = Stream()
        self.events = [Event() for _ in range(4)]
        self._graph = self._graph_exec = None
        try:
            if cuda_graph:
                self._capture()
        except BaseException:
            self.close()
            raise

    def _capture(self) -> None:
        drv = _driver()
        self.enqueue_compute(self.stream.handle)
        self.stream.synchronize()
        cu("cuStreamBeginCapture", self.stream.stream, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        try:
            self.enqueue_compute(self.stream.handle)
        finally:  # end the capture whatever happened, or the stream stays unusable
            self._graph = cu("cuStreamEndCapture", self.stream.stream)
        self._graph_exec = cu("cuGraphInstantiate", self._graph, 0)

    def step(self) -> stats.Iteration:
        """Run one inference and return its phases from the event times."""
        s = self.stream
        start, copied_in, computed, copied_out = self.events
        start.record(s)
        for dev, host in self.inputs:
            cu("cuMemcpyHtoDAsync", dev.ptr, host.ptr, host.nbytes, s.stream)
        copied_in.record(s)
        if self._graph_exec is not None:
            cu("cuGraphLaunch", self._graph_exec, s.stream)
        else:
            self.enqueue_compute(s.handle)
        computed.record(s)
        for host, dev in self.outputs:
            cu("cuMemcpyDtoHAsync", host.ptr, dev.ptr, host.nbytes, s.stream)
        copied_out.record(s)
        s.synchronize()
        times = [0.0, *(elapsed_ms(start, e) for e in (copied_in, computed, copied_out))]
        return iteration_from_event_times(times, h2d=bool(self.inputs), d2h=bool(self.outputs))

    def close(self) -> None:
        """Free the graph, events and stream (not the buffers, which belong to the caller)."""
        if self._graph_exec is not None:
            cu("cuGraphExecDestroy", self._graph_exec)
            self._graph_exec = None
        if self._graph is not None:
            cu("cuGraphDestroy", self._graph)
            self._graph = None
        for event in self.events:
            event.close()
        self.stream.close()


def benchmark_pipeline(
    pipeline: TimedPipeline,
    device: CudaDevice,
    *,
    warmup_ms: float = 200,
    duration_s: float = 3.0,
    min_iterations: int = 10,
    max_iterations: int | None = None,
    free_before: int | None = None,
) -> stats.Measurement:
    """``stats.measure`` over ``pipeline.step`` with what makes a result interpretable in ``extra``:
    the GPU clocks at start and end (throttling shows as a drop), the host wall time per step (event
    time plus launch, synchronization and Python overhead), the ``cuda_graph`` flag and, given the free
    memory ``free_before`` anything was loaded, ``peak_device_memory_bytes``: that minus the lowest free
    memory seen during the run (other processes on the GPU count too)."""
    clocks = gpu_clocks(pci_bus_id=device.pci_bus_id)
    lowest_free = device.mem_info()[0]
    host_ms: list[float] = []

    def step() -> stats.Iteration:
        nonlocal lowest_free
        begin = time.perf_counter()
        it = pipeline.step()
        host_ms.append((time.perf_counter() - begin) * 1000)
        lowest_free = min(lowest_free, device.mem_info()[0])
        return it

    m = stats.measure(
        step, warmup_ms=warmup_ms, duration_s=duration_s, min_iterations=min_iterations, max_iterations=max_iterations
    )
    measured = host_ms[m.warmup_iterations :]
    m.extra.update(
        gpu_clocks=clocks,
        gpu_clocks_end=gpu_clocks(pci_bus_id=device.pci_bus_id),
        host_wall=stats.summarize(measured).to_dict(),
        cuda_graph=pipeline.cuda_graph,
        peak_device_memory_bytes=None if free_before is None else free_before - lowest_free,
    )
    return m
