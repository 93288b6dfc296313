"""Runs an ``onnxruntime/cuda-smXY`` artifact on the GPU for the benchmark and accuracy stage, on a farm's worker or
on a deploy machine (``enginefarm measure``).

The benchmark is the farm's CUDA timing (enginefarm/measure/gpu_timing.py), not ONNX Runtime's profiler: inputs and
outputs are bound to device buffers of our own (I/O binding), the CUDA provider enqueues its kernels on our stream
(``user_compute_stream``), and ``TimedPipeline`` brackets the host-to-device copies, ``run_with_iobinding`` and the
device-to-host copies with CUDA events on that stream, at trtexec's warm-up, duration and percentiles
(enginefarm/core/stats.py). GPU memory in use is the driver's free memory before the session was made minus the
lowest seen during the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from enginefarm.core.errors import BuildFailed, TargetUnavailable
from enginefarm.core.ortcuda import ORT_CUDA_PROVIDER, RUN_OPTION_KEYS, known_run_options
from enginefarm.core.probe.gpus import GpuInfo
from enginefarm.core.probe.machineprobe import MachineProbe, probe_machine
from enginefarm.core.stats import Measurement
from enginefarm.measure.cuda_driver import CudaDevice, DeviceBuffer, PinnedArray, Stream, cu
from enginefarm.measure.gpu_timing import TimedPipeline, benchmark_pipeline
from enginefarm.measure.modules import load_module

if TYPE_CHECKING:
    from enginefarm.core.spec import BenchmarkSpec

B = TypeVar("B", DeviceBuffer, PinnedArray)

# ONNX Runtime's tensor type names → numpy.
ORT_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}
# What the benchmark session adds to the saved graph: every optimization, for this GPU, as the CPU runner does.
RUN_LEVEL = "ORT_ENABLE_ALL"


def numpy_dtype(ort_type: str) -> np.dtype[Any]:
    try:
        dtype: np.dtype[Any] = np.dtype(ORT_DTYPES[ort_type])
        return dtype
    except KeyError:
        raise BuildFailed(f"an output of type {ort_type} has no numpy type to copy it into") from None


@dataclass(frozen=True)
class SessionChoice:
    """How the CUDA provider runs an artifact, beyond its defaults: ``prefer_nhwc`` (convolutions in NHWC, the
    layout Hopper's and Ampere's tensor cores read; the provider adds the transposes) and ``enable_cuda_graph`` (the
    whole graph captured once and replayed by one launch: no per-kernel launch gaps; it needs static shapes and
    inputs and outputs bound at fixed addresses, which the benchmark's I/O binding has). The GPU worker times each
    and keeps the fastest whose outputs pass the check (worker/measure/sessions.py); the engine carries its
    ``provider_options`` (``EngineDescriptor.run_options``) to every machine that loads it."""

    nhwc: bool = False
    cuda_graph: bool = False

    @property
    def name(self) -> str:
        parts = [p for p, on in (("nhwc", self.nhwc), ("cuda-graph", self.cuda_graph)) if on]
        return "+".join(parts) or "default"

    def provider_options(self) -> dict[str, str]:
        """What this choice adds to the provider's options (none for the defaults)."""
        nhwc, graph = RUN_OPTION_KEYS
        return {**({nhwc: "1"} if self.nhwc else {}), **({graph: "1"} if self.cuda_graph else {})}

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> SessionChoice:
        """The choice an engine's ``run_options`` record (unknown keys are left to the caller)."""
        known = known_run_options(dict(options or {}))
        nhwc, graph = RUN_OPTION_KEYS
        return cls(nhwc=known.get(nhwc) == "1", cuda_graph=known.get(graph) == "1")

    def plain(self) -> SessionChoice:
        """The same kernels without the graph: what runs one inference on arrays (the accuracy check's feeds)."""
        return SessionChoice(nhwc=self.nhwc)


# The choices the GPU worker times, the defaults first.
SESSION_CHOICES = (
    SessionChoice(),
    SessionChoice(nhwc=True),
    SessionChoice(cuda_graph=True),
    SessionChoice(nhwc=True, cuda_graph=True),
)


def cuda_provider_options(tf32: bool, device_id: int = 0, stream: int | None = None) -> dict[str, str]:
    """The CUDA provider's options, as strings (the form ONNX Runtime takes and the catalog records).

    ``use_tf32``: TF32 tensor-core math in fp32 convolutions and matrix products, on by default as in the
    runtime itself. ``cudnn_conv_algo_search`` EXHAUSTIVE: cuDNN times every convolution algorithm once per
    shape and keeps the fastest (the runtime's default too). ``stream``: a caller's CUDA stream that the
    provider enqueues all its work on, so that events on that stream bracket exactly one inference."""
    options = {
        "device_id": str(device_id),
        "use_tf32": "1" if tf32 else "0",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "arena_extend_strategy": "kNextPowerOfTwo",
    }
    if stream is not None:
        options.update(has_user_compute_stream="1", user_compute_stream=str(stream))
    return options


def runtime_facts(probe: MachineProbe, gpu: GpuInfo | None, session_options: dict[str, Any]) -> dict[str, Any]:
    """GPU model, compute capability, driver, CUDA, cuDNN and ONNX Runtime versions and the session options: what
    the catalog keeps with each ONNX Runtime CUDA artifact and each of its measurements."""
    return {
        "gpu": gpu.name if gpu else None,
        "compute_capability": gpu.compute_capability if gpu else None,
        "driver": probe.driver_version,
        "driver_cuda": probe.cuda_version,
        "cuda": probe.ort_cuda,
        "cudnn": probe.cudnn_version,
        "onnxruntime": probe.modules.get("onnxruntime"),
        "session": session_options,
    }


class OrtCudaRunner:
    """An ONNX Runtime CUDA session on GPU ``device_index``, on a stream of ours. ``tf32`` as the spec says,
    ``choice``: the provider options beyond the defaults. With a CUDA graph, each ``benchmark`` captures its own (a
    graph holds one shape), and ``infer`` runs the same kernels without one (``SessionChoice.plain``)."""

    def __init__(
        self, model_path: Path, tf32: bool = True, device_index: int = 0, choice: SessionChoice = SessionChoice()
    ):
        self.choice = choice
        self._plain: OrtCudaRunner | None = None
        self._benchmarked = False
        self.ort = load_module("onnxruntime")
        self.probe = probe_machine()  # preloads CUDA and cuDNN from the nvidia-* wheels where ORT needs them
        if not self.probe.ort_cuda:
            raise TargetUnavailable(f"ONNX Runtime's CUDA provider is not usable here: {self.probe.ort_cuda_error}")
        self.model_path, self.tf32, self.device_index = model_path, tf32, device_index
        self.device: CudaDevice | None = CudaDevice(device_index)  # None once closed
        self._buffers: list[Any] = []
        try:
            self.free_before = self.device.mem_info()[0]
            self.stream: Stream | None = Stream()  # None once closed
            self.session, self.provider_options = self._session(tf32, self.stream.handle)
        except BaseException:
            self.close()
            raise
        self.outputs = [o.name for o in self.session.get_outputs()]
        gpu = next((g for g in self.probe.gpus if g.index == device_index), None)
        self.gpu_name = gpu.name if gpu else self.device.name
        self.compute_capability = self.device.compute_capability
        options = "" if choice == SessionChoice() else f", {choice.name}"
        tf32_word = "on" if tf32 else "off"
        self.label = f"{self.gpu_name} (ONNX Runtime {self.ort.__version__} CUDA, TF32 {tf32_word}{options})"
        self.facts = runtime_facts(
            self.probe,
            gpu,
            {
                "graph_optimization_level": RUN_LEVEL,
                "providers": [ORT_CUDA_PROVIDER],
                "provider_options": self._recorded(self.provider_options),
            },
        )

    @staticmethod
    def _recorded(options: dict[str, str]) -> dict[str, str]:
        # The stream's address means nothing outside this process.
        return {k: v for k, v in options.items() if k != "user_compute_stream"}

    def _session(self, tf32: bool, stream: int | None) -> tuple[Any, dict[str, str]]:
        ort = self.ort
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, RUN_LEVEL)
        provider = {**cuda_provider_options(tf32, self.device_index, stream), **self.choice.provider_options()}
        try:
            session = ort.InferenceSession(str(self.model_path), options, providers=[(ORT_CUDA_PROVIDER, provider)])
        except Exception as exc:
            raise BuildFailed(f"ONNX Runtime (CUDA) could not load the artifact: {exc}") from exc
        if ORT_CUDA_PROVIDER not in session.get_providers():
            raise TargetUnavailable(f"ONNX Runtime fell back to the CPU ({', '.join(session.get_providers())})")
        return session, provider

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.choice.cuda_graph:  # a graph replays the addresses it was captured with: arrays need a plain run
            if self._plain is None:
                self._plain = OrtCudaRunner(self.model_path, self.tf32, self.device_index, self.choice.plain())
            return self._plain.infer(inputs)
        return dict(zip(self.outputs, self.session.run(self.outputs, inputs)))

    def without_tf32(self) -> OrtCudaRunner | None:
        """The same artifact with TF32 off, to tell TF32's differences from real ones; None when TF32 is off."""
        if not self.tf32:
            return None
        return OrtCudaRunner(self.model_path, tf32=False, device_index=self.device_index, choice=self.choice.plain())

    def benchmark(self, inputs: dict[str, np.ndarray], spec: BenchmarkSpec) -> Measurement:
        """The farm's CUDA timing of one inference at these inputs' shapes (``spec``: a BenchmarkSpec)."""
        assert self.device is not None and self.stream is not None  # open while the session is: close() drops all
        if self.choice.cuda_graph and self._benchmarked:  # a graph holds one shape: a new session captures anew
            self.session = None
            self.session, _ = self._session(self.tf32, self.stream.handle)
        self._benchmarked = True
        binding = self.session.io_binding()
        idx = self.device_index
        pairs_in: list[tuple[DeviceBuffer, PinnedArray]] = []
        pairs_out: list[tuple[PinnedArray, DeviceBuffer]] = []
        pipeline = None
        try:
            for name, value in inputs.items():
                value = np.ascontiguousarray(value)
                host, dev = self._keep(PinnedArray(value.shape, value.dtype)), self._keep(DeviceBuffer(value.nbytes))
                host.array[...] = value
                binding.bind_input(name, "cuda", idx, value.dtype, list(value.shape), dev.ptr)
                pairs_in.append((dev, host))
            # The outputs' shapes, then buffers of ours bound to them, so every timed run writes to the addresses the
            # copies read from. A graph session captures in its first runs, so they must already have our buffers:
            # its shapes come from a plain run of the same kernels.
            for dev, host in pairs_in:
                cu("cuMemcpyHtoD", dev.ptr, host.ptr, host.nbytes)
            if self.choice.cuda_graph:
                plain = self.infer(inputs)
                shapes = [(list(plain[n].shape), np.dtype(plain[n].dtype)) for n in self.outputs]
                self._close_plain()  # its weights and arena are no part of this session's memory figure
            else:  # one run with outputs on the device, allocated by ONNX Runtime
                for name in self.outputs:
                    binding.bind_output(name, "cuda", idx)
                self.session.run_with_iobinding(binding)
                shapes = [(v.shape(), numpy_dtype(v.data_type())) for v in binding.get_outputs()]
                binding.clear_binding_outputs()
            for name, (shape, dtype) in zip(self.outputs, shapes):
                host = self._keep(PinnedArray(shape, dtype))
                dev = self._keep(DeviceBuffer(host.nbytes))
                binding.bind_output(name, "cuda", idx, dtype, list(shape), dev.ptr)
                pairs_out.append((host, dev))
            # On the provider's own stream: the events bracket its kernels, and a graph it captured replays there.
            pipeline = TimedPipeline(
                pairs_in, lambda _stream: self.session.run_with_iobinding(binding), pairs_out, stream=self.stream
            )
            m = benchmark_pipeline(
                pipeline,
                self.device,
                warmup_ms=spec.warmup_ms,
                duration_s=spec.duration_s,
                min_iterations=spec.iterations,
                free_before=self.free_before,
            )
            if self.choice.cuda_graph:
                m.extra["replay_max_abs_diff"] = self._replay_difference(inputs, pairs_out)
        except (BuildFailed, TargetUnavailable):
            raise
        except Exception as exc:  # ORT's run errors (a shape the graph refuses, out of memory) are the model's
            raise BuildFailed(f"ONNX Runtime (CUDA) failed to run: {type(exc).__name__}: {exc}") from exc
        finally:
            if pipeline is not None:
                pipeline.close()
            self._free()
        peak = m.extra.get("peak_device_memory_bytes")
        size = self.model_path.stat().st_size
        # The memory rule adds the artifact's size to this (compat.engine_memory_bytes): store what comes on top,
        # so that the sum is the memory this inference was measured to take.
        m.extra.update(
            device_memory_bytes=max(peak - size, 0) if peak is not None else None,
            gpu_memory_in_use_bytes=peak,
            runtime=self.facts,
            cuda_graph=self.choice.cuda_graph,
            session=self.choice.name,
            onnxruntime=self.ort.__version__,
            tf32=self.tf32,
        )
        return m

    def _replay_difference(
        self, inputs: dict[str, np.ndarray], outputs: list[tuple[PinnedArray, DeviceBuffer]]
    ) -> float:
        """The largest difference between what the last replay of the graph wrote and a plain run of the same
        inputs: a graph that replays stale addresses, or never ran, shows here. BuildFailed past 1e-2."""
        plain = self.infer(inputs)
        self._close_plain()
        worst = 0.0
        for name, (host, _dev) in zip(self.outputs, outputs):
            got, want = host.array.astype(np.float64), np.asarray(plain[name], dtype=np.float64)
            if got.shape != want.shape:
                raise BuildFailed(f"the CUDA graph's output {name} has shape {got.shape}, a plain run's {want.shape}")
            if got.size:
                worst = max(worst, float(np.nanmax(np.abs(got - want) / (1.0 + np.abs(want)))))
        if not worst <= 1e-2:
            raise BuildFailed(f"the CUDA graph's replay differs from a plain run by {worst:.3g} (relative)")
        return worst

    def _keep(self, buffer: B) -> B:
        self._buffers.append(buffer)
        return buffer

    def _free(self) -> None:
        while self._buffers:
            self._buffers.pop().close()

    def _close_plain(self) -> None:
        if self._plain is not None:
            self._plain.close()
            self._plain = None

    def close(self) -> None:
        self.session = None
        self._close_plain()
        self._free()
        stream = getattr(self, "stream", None)
        if stream is not None:
            stream.close()
            self.stream = None
        if self.device is not None:
            self.device.close()
            self.device = None
