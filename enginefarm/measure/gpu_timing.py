"""GPU timing for engine benchmarks: CUDA events around the copies and the compute of one inference.

The benchmark stage times an engine the way trtexec does: inputs are copied host→device from pinned
memory, the engine is enqueued, outputs are copied back, all on one stream, with a CUDA event between
phases. The GPU's own clock then says how long each phase took, free of Python's and the driver's
launch overhead. ``stats.measure`` drives the loop (trtexec's 200 ms warm-up, at least 3 s and 10
iterations) and ``stats.summarize`` reports trtexec's percentiles; the GPU's clocks (NVML) go with every result.

Everything here is engine-agnostic (``TimedPipeline`` times any ``enqueue_compute(stream_handle)``); the
TensorRT engine that runs inside it is ``enginefarm.measure.trt_runner``, and the CUDA calls, device, memory,
streams and events are ``enginefarm.measure.cuda_driver``'s. bench/gpu_timing.py proves this part on a real GPU
with a hand-written kernel in place of ``execute_async_v3``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from enginefarm.core import stats
from enginefarm.core.nvml import NvmlUnavailable, nvml_session
from enginefarm.measure.cuda_driver import (
    CudaDevice,
    DeviceBuffer,
    Event,
    PinnedArray,
    Stream,
    cu,
    driver,
    elapsed_ms,
)


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
            readings: dict[str, Callable[..., Any]] = {}
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
    the copies stay outside the graph. ``stream``: a stream of the caller's that the compute is enqueued on anyway
    (a runtime given it once, as ONNX Runtime's CUDA provider is); the pipeline makes its own otherwise.
    """

    def __init__(
        self,
        inputs: Sequence[tuple[DeviceBuffer, PinnedArray]],
        enqueue_compute: Callable[[int], None],
        outputs: Sequence[tuple[PinnedArray, DeviceBuffer]],
        *,
        cuda_graph: bool = False,
        stream: Stream | None = None,
    ):
        for dev, host in [*inputs, *((d, h) for h, d in outputs)]:
            if host.nbytes > dev.nbytes:
                raise ValueError(f"a {host.nbytes}-byte host array does not fit a {dev.nbytes}-byte device buffer")
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.enqueue_compute = enqueue_compute
        self.cuda_graph = cuda_graph
        self._own_stream = stream is None
        self.stream = Stream() if stream is None else stream
        self.events = [Event() for _ in range(4)]
        self._graph = self._graph_exec = None
        try:
            if cuda_graph:
                self._capture()
        except BaseException:
            self.close()
            raise

    def _capture(self) -> None:
        drv = driver()
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
        if self._own_stream:
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
