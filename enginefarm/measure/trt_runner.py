"""A TensorRT engine on the GPU, timed: ``TensorRTEngineRunner`` deserializes an engine with the TensorRT (or
TensorRT-RTX) runtime module it is given, binds every I/O tensor to device memory and pinned host arrays, and
enqueues ``execute_async_v3`` inside ``gpu_timing.TimedPipeline``'s CUDA events. The CUDA side (device, memory,
streams, events) is ``enginefarm.measure.cuda_driver``, the timed loop ``enginefarm.measure.gpu_timing``; what is here
is TensorRT's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from enginefarm.core import stats
from enginefarm.core.errors import BuildFailed, TargetUnavailable
from enginefarm.measure.cuda_driver import CudaDevice, DeviceBuffer, PinnedArray
from enginefarm.measure.gpu_timing import TimedPipeline, benchmark_pipeline

if TYPE_CHECKING:
    from enginefarm.core.spec import BenchmarkSpec


def numpy_dtype(trt_module: ModuleType, trt_dtype: Any) -> np.dtype[Any]:
    """The numpy dtype of a TensorRT DataType; BF16, FP8, FP4 and INT4 have none, and say so."""
    try:
        dtype: np.dtype[Any] = np.dtype(trt_module.nptype(trt_dtype))
        return dtype
    except TypeError as exc:
        raise BuildFailed(
            f"an engine tensor has data type {getattr(trt_dtype, 'name', trt_dtype)}, "
            f"which has no numpy equivalent: the benchmark cannot feed or read it"
        ) from exc


@dataclass(frozen=True)
class TensorSpec:
    name: str
    is_input: bool
    dtype: np.dtype


def io_tensors(engine: Any, trt_module: ModuleType) -> list[TensorSpec]:
    """The engine's IO tensors in its order, each with its direction and numpy dtype."""
    out = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        out.append(
            TensorSpec(
                name,
                engine.get_tensor_mode(name) == trt_module.TensorIOMode.INPUT,
                numpy_dtype(trt_module, engine.get_tensor_dtype(name)),
            )
        )
    return out


def _error_logger(trt_module: ModuleType) -> Any:
    """A TensorRT logger that prints nothing and keeps the last errors, to put in our exceptions."""
    ilogger: Any = trt_module.ILogger  # a class of the module it is given

    class _Logger(ilogger):
        def __init__(self) -> None:
            trt_module.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt_module.ILogger.Severity.ERROR:
                self.errors = [*self.errors[-4:], str(msg)]

    return _Logger()


class TensorRTEngineRunner:
    """One serialized TensorRT (or TensorRT-RTX: pass its module) engine loaded on one GPU, to check its
    outputs (``infer``) and time it (``benchmark``). IO buffers are allocated per set of input shapes and
    reused while the shapes stay the same; outputs with data-dependent shapes are not supported."""

    def __init__(self, engine_bytes: bytes, trt_module: ModuleType, device_index: int = 0):
        self.device = CudaDevice(device_index)
        self._buffers: list[DeviceBuffer | PinnedArray] = []
        self._host: dict[str, PinnedArray] = {}
        self._in_pairs: list[tuple[DeviceBuffer, PinnedArray]] = []
        self._out_pairs: list[tuple[PinnedArray, DeviceBuffer]] = []
        self._pipelines: dict[bool, TimedPipeline] = {}
        self._shapes: dict[str, tuple[int, ...]] | None = None
        try:
            self.free_before_load = self.device.mem_info()[0]
            self._logger = _error_logger(trt_module)
            self._runtime = trt_module.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(engine_bytes)
            if self.engine is None:  # built for another GPU or TensorRT version, or not an engine at all
                raise TargetUnavailable(f"TensorRT cannot load the engine on this worker: {self._errors()}")
            self.context = self.engine.create_execution_context()
            if self.context is None:
                raise BuildFailed(f"TensorRT could not create an execution context: {self._errors()}")
            self.tensors = io_tensors(self.engine, trt_module)
        except BaseException:
            self.close()
            raise

    def _errors(self) -> str:
        return " | ".join(self._logger.errors) or "no message"

    @property
    def device_memory_bytes(self) -> int:
        """The activation memory TensorRT takes per context (``device_memory_size`` before TensorRT 10.1)."""
        size = getattr(self.engine, "device_memory_size_v2", None)
        return int(size if size is not None else self.engine.device_memory_size)

    def _enqueue(self, stream_handle: int) -> None:
        if not self.context.execute_async_v3(stream_handle):
            raise BuildFailed(f"execute_async_v3 failed: {self._errors()}")

    def _pipeline(self, inputs: Mapping[str, np.ndarray], cuda_graph: bool) -> TimedPipeline:
        """Set the input shapes, (re)allocate buffers when they changed, fill the pinned inputs."""
        names = {t.name for t in self.tensors if t.is_input}
        if set(inputs) != names:
            raise ValueError(f"the engine's inputs are {sorted(names)}, got {sorted(inputs)}")
        shapes = {name: tuple(int(d) for d in np.shape(a)) for name, a in inputs.items()}
        if shapes != self._shapes:
            self._release()
            self._allocate(shapes)
            self._shapes = shapes
        for name, array in inputs.items():
            np.copyto(self._host[name].array, np.asarray(array), casting="same_kind")
        if cuda_graph not in self._pipelines:
            self._pipelines[cuda_graph] = TimedPipeline(
                self._in_pairs, self._enqueue, self._out_pairs, cuda_graph=cuda_graph
            )
        return self._pipelines[cuda_graph]

    def _allocate(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        for name, shape in shapes.items():
            if not self.context.set_input_shape(name, shape):
                raise BuildFailed(
                    f"input {name}: shape {list(shape)} is outside the engine's profile: {self._errors()}"
                )
        missing = self.context.infer_shapes()
        if missing:
            raise BuildFailed(f"TensorRT cannot resolve the shapes; inputs missing: {list(missing)}")
        for t in self.tensors:
            shape = tuple(self.context.get_tensor_shape(t.name))
            if any(d < 0 for d in shape):
                raise BuildFailed(f"tensor {t.name} has a data-dependent shape {list(shape)}: not supported")
            host = self._host[t.name] = PinnedArray(shape, t.dtype)
            self._buffers.append(host)
            dev = DeviceBuffer(host.nbytes)
            self._buffers.append(dev)
            if not self.context.set_tensor_address(t.name, dev.ptr):
                raise BuildFailed(f"set_tensor_address({t.name}) failed: {self._errors()}")
            if t.is_input:
                self._in_pairs.append((dev, host))
            else:
                self._out_pairs.append((host, dev))

    def _release(self) -> None:
        for p in self._pipelines.values():
            p.close()
        self._pipelines.clear()
        for b in self._buffers:
            b.close()
        self._buffers.clear()
        self._host.clear()
        self._in_pairs.clear()
        self._out_pairs.clear()
        self._shapes = None

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference; returns copies of the outputs, by name."""
        self._pipeline(inputs, cuda_graph=False).step()
        return {t.name: self._host[t.name].array.copy() for t in self.tensors if not t.is_input}

    def benchmark(self, inputs: Mapping[str, np.ndarray], spec: BenchmarkSpec) -> stats.Measurement:
        """Time the engine at these inputs' shapes as ``spec`` says (warm-up, duration, iterations, graph)."""
        pipeline = self._pipeline(inputs, cuda_graph=spec.cuda_graph)
        m = benchmark_pipeline(
            pipeline,
            self.device,
            warmup_ms=spec.warmup_ms,
            duration_s=spec.duration_s,
            min_iterations=spec.iterations,
            free_before=self.free_before_load,
        )
        m.extra["device_memory_bytes"] = self.device_memory_bytes
        return m

    def close(self) -> None:
        """Free the buffers, then the TensorRT objects (they hold device memory), then the context."""
        self._release()
        for attr in ("context", "engine", "_runtime"):
            if hasattr(self, attr):
                delattr(self, attr)
        self.device.close()

    def __enter__(self) -> TensorRTEngineRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
