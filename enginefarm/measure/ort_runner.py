"""ONNX Runtime on the CPU: the CPU artifact's runner, for the farm's benchmark and accuracy check and for a deploy
machine's (``enginefarm measure``). Each timed step binds the inputs, runs the graph and copies the outputs back,
timed by the farm's trtexec rules (``enginefarm.core.stats``)."""

from __future__ import annotations

import mmap
import os
import platform
import resource
import time
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from enginefarm.core.errors import BuildFailed
from enginefarm.core.stats import Iteration, Measurement, measure
from enginefarm.measure.modules import load_module

if TYPE_CHECKING:
    from enginefarm.core.spec import BenchmarkSpec

QDQ_OP = b"QuantizeLinear"  # an op type is plain text in the model's protobuf (and DequantizeLinear holds it too)


@lru_cache
def cpu_has_vnni() -> bool:
    """Whether the CPU has VNNI int8 dot products (x86); other architectures are not affected."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "vnni" in flags or not any(f in flags for f in (" avx2", " avx512"))


def has_qdq(model_path: Path) -> bool:
    """Whether the model holds Q/DQ nodes: its bytes name the op type (read mapped, without loading the graph, so a
    deploy machine needs no onnx package)."""
    with model_path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return view.find(QDQ_OP) >= 0


def optimization_level(ort: ModuleType, model_path: Path) -> tuple[object, str]:
    """The graph optimization level for this model on this CPU, and why. ONNX Runtime fuses Q/DQ pairs into
    integer kernels (QLinearConv, …) from ORT_ENABLE_EXTENDED up; on x86 CPUs with AVX2/AVX-512 but no VNNI
    those kernels saturate their u8·s8 products (measured: rel L2 0.105 against FP32 instead of 0.020 on a
    small conv net). There a Q/DQ model keeps the basic level, which runs the Q/DQ arithmetic exactly."""
    levels = ort.GraphOptimizationLevel
    if not cpu_has_vnni() and has_qdq(model_path):
        return (
            levels.ORT_ENABLE_BASIC,
            "ORT_ENABLE_BASIC: Q/DQ model on a CPU without VNNI, fused int8 kernels would saturate",
        )
    return levels.ORT_ENABLE_ALL, "ORT_ENABLE_ALL"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's), what CPU figures are keyed by."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class OrtRunner:
    """An ONNX Runtime CPU session. Each timed step binds the inputs (``h2d``: handing numpy buffers to ONNX
    Runtime), runs the graph (``compute``) and copies the outputs back to numpy (``d2h``)."""

    def __init__(self, model_path: Path, threads: int | None = None):
        ort = load_module("onnxruntime")
        self.ort = ort
        options = ort.SessionOptions()
        options.graph_optimization_level = optimization_level(ort, model_path)[0]  # as the engine was built
        self.threads = threads or len(os.sched_getaffinity(0))
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BuildFailed(f"ONNX Runtime could not load the engine: {exc}") from exc
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.label = f"CPU {platform.machine()} ({cpu_name()}), {self.threads} threads"

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, inputs)))

    def benchmark(self, inputs: dict[str, np.ndarray], spec: BenchmarkSpec) -> Measurement:
        binding = self.session.io_binding()
        for name in self.outputs:
            binding.bind_output(name, "cpu")
        clock = time.perf_counter

        def step() -> Iteration:
            t0 = clock()
            for name, array in inputs.items():
                binding.bind_cpu_input(name, array)
            t1 = clock()
            self.session.run_with_iobinding(binding)
            t2 = clock()
            binding.copy_outputs_to_cpu()
            t3 = clock()
            return Iteration(e2e=(t3 - t0) * 1e3, compute=(t2 - t1) * 1e3, h2d=(t1 - t0) * 1e3, d2h=(t3 - t2) * 1e3)

        before = _peak_rss_bytes()
        result = measure(step, warmup_ms=spec.warmup_ms, duration_s=spec.duration_s, min_iterations=spec.iterations)
        result.extra.update(
            threads=self.threads,
            cpu=cpu_name(),
            onnxruntime=self.ort.__version__,
            peak_rss_bytes=_peak_rss_bytes(),
            peak_rss_growth_bytes=_peak_rss_bytes() - before,
        )
        return result

    def close(self) -> None:
        self.session = None
