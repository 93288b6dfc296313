"""The engine benchmark's GPU timing, proven on a real GPU with a kernel in place of the engine.

enginefarm/measure/gpu_timing.py times an engine as trtexec does: CUDA events around the host→device copies, the
compute and the device→host copies on one stream. TensorRT engines cannot run everywhere we can test,
so this script runs the same ``TimedPipeline`` and ``benchmark_pipeline`` with an NVRTC-compiled kernel
(a chain of FMAs over a 64 MiB float buffer, about 1 ms on a Hopper GPU) as the compute step, 64 MiB
copies each way, trtexec's defaults (200 ms warm-up, at least 3 s and 10 iterations), without and
with a CUDA graph, and checks that the numbers are believable:

  (a) the kernel's output, copied back by the pipeline, matches numpy's closed form;
  (b) H2D/D2H bandwidth from the measured copy times is plausible for PCIe/NVLink-C2C;
  (c) with torch importable, torch.cuda.Event times the same kernel launch: ratio of medians ≈ 1;
  (d) ``TensorRTEngineRunner`` itself, driven by a stand-in TensorRT module whose "engine" launches the
      same kernel, gives the right output and the same compute time.

It prints ratios against baselines of the same run: graph vs no graph, host wall clock vs event e2e.

    python3 bench/gpu_timing.py [--device 0] [--mib 64] [--fma 2000] [--duration 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import enum
import json
import platform
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from enginefarm.core import stats  # noqa: E402
from enginefarm.core.errors import BackendMissing  # noqa: E402
from enginefarm.measure import cuda_driver as D  # noqa: E402
from enginefarm.measure import gpu_timing as G  # noqa: E402
from enginefarm.measure import trt_runner as R  # noqa: E402

KERNEL = r"""
extern "C" __global__ void fma_chain(const float* __restrict__ x, float* __restrict__ y,
                                     unsigned long long n, int steps, float a, float b) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < steps; ++k) v = fmaf(v, a, b);
        y[i] = v;
    }
}
"""
A, B = 0.999, 0.001  # v ← a·v + b contracts towards 1, so float32 rounding stays below ~6e-5
THREADS = 256
TOLERANCE = 5e-4
BANDWIDTH_GBS = (1.0, 500.0)  # PCIe 3 x16 at worst, NVLink-C2C (GH200, 450 GB/s) at best


def compile_kernel(cc: str) -> bytes:
    """NVRTC → a cubin for this GPU's exact architecture (a cubin loads on drivers older than NVRTC's
    CUDA minor version, PTX would not)."""
    from cuda.bindings import nvrtc

    prog = D.check("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(KERNEL.encode(), b"fma_chain.cu", 0, [], []))
    try:
        opts = [f"--gpu-architecture=sm_{cc.replace('.', '')}".encode()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            size = D.check("nvrtcGetProgramLogSize", nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            D.check("nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(prog, log))
            raise D.CudaError("nvrtcCompileProgram", err, log.decode(errors="replace").strip("\0 \n"))
        size = D.check("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        D.check("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, cubin))
        return cubin
    finally:
        D.check("nvrtcDestroyProgram", nvrtc.nvrtcDestroyProgram(prog))


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    major, minor = D.check("nvrtcVersion", nvrtc.nvrtcVersion())
    return f"{major}.{minor}"


class FmaKernel:
    """The compute step: ``launch(stream_handle)`` enqueues y = fma-chain(x) on that stream."""

    def __init__(self, cubin: bytes, steps: int):
        image = np.frombuffer(cubin, dtype=np.uint8)
        self.module = D.cu("cuModuleLoadData", image.ctypes.data)
        self.function = D.cu("cuModuleGetFunction", self.module, b"fma_chain")
        self.steps = steps
        self._args: list[np.ndarray] = []
        self._arg_ptrs = np.zeros(0, dtype=np.uint64)
        self.n = 0

    def bind(self, x_ptr: int, y_ptr: int, n: int) -> None:
        """Set the buffers; the argument arrays are kept alive here, as cuLaunchKernel reads them by address."""
        self.n = n
        self._args = [
            np.array([x_ptr], np.uint64),
            np.array([y_ptr], np.uint64),
            np.array([n], np.uint64),
            np.array([self.steps], np.int32),
            np.array([A], np.float32),
            np.array([B], np.float32),
        ]
        self._arg_ptrs = np.array([a.ctypes.data for a in self._args], dtype=np.uint64)

    def launch(self, stream_handle: int) -> None:
        blocks = (self.n + THREADS - 1) // THREADS
        D.cu(
            "cuLaunchKernel",
            self.function,
            blocks,
            1,
            1,
            THREADS,
            1,
            1,
            0,
            stream_handle,
            self._arg_ptrs.ctypes.data,
            0,
        )

    def expected(self, x: np.ndarray) -> np.ndarray:
        """Closed form of ``steps`` times v ← a·v + b: 1 + aⁿ·(x − 1) (the fixed point is b / (1 − a) = 1)."""
        a, b = float(np.float32(A)), float(np.float32(B))
        fixed = b / (1 - a)
        return fixed + a**self.steps * (x.astype(np.float64) - fixed)

    def flops(self) -> float:
        return 2.0 * self.n * self.steps

    def close(self) -> None:
        D.cu("cuModuleUnload", self.module)


# --------------------------------------------------------------------------- a stand-in TensorRT module


def stand_in_trt(kernel: FmaKernel, n: int) -> SimpleNamespace:
    """Just the TensorRT Python API that ``TensorRTEngineRunner`` calls, with an "engine" of one float32
    input x[n] and output y[n] whose ``execute_async_v3`` launches ``kernel``. It exercises the runner's
    own code (IO enumeration, shapes, buffers, addresses, infer, benchmark) on the GPU; what a real
    engine does inside deserialize/execute is TensorRT's and is not tested by it."""

    class Severity(enum.IntEnum):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    class ILogger:
        def __init__(self) -> None:
            pass

    ILogger.Severity = Severity  # type: ignore[attr-defined]
    DataType = enum.Enum("DataType", "FLOAT BF16")
    TensorIOMode = enum.Enum("TensorIOMode", "INPUT OUTPUT")
    tensors = {"x": TensorIOMode.INPUT, "y": TensorIOMode.OUTPUT}

    class Context:
        def __init__(self) -> None:
            self.address: dict[str, int] = {}
            self.shape: tuple[int, ...] | None = None

        def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
            self.shape = tuple(shape) if name == "x" and tuple(shape) == (n,) else None
            return self.shape is not None

        def infer_shapes(self) -> list[str]:
            return [] if self.shape else ["x"]

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return (n,)

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.address[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            kernel.bind(self.address["x"], self.address["y"], n)
            kernel.launch(stream_handle)
            return True

    class Engine:
        num_io_tensors = 2
        device_memory_size_v2 = 0

        def get_tensor_name(self, i: int) -> str:
            return list(tensors)[i]

        def get_tensor_mode(self, name: str) -> Any:
            return tensors[name]

        def get_tensor_dtype(self, name: str) -> Any:
            return DataType.FLOAT

        def create_execution_context(self) -> Context:
            return Context()

    class Runtime:
        def __init__(self, logger: ILogger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> Engine:
            return Engine()

    def nptype(dtype: Any) -> type:
        if dtype is DataType.FLOAT:
            return np.float32
        raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")

    return SimpleNamespace(
        ILogger=ILogger, Runtime=Runtime, DataType=DataType, TensorIOMode=TensorIOMode, nptype=nptype
    )


# --------------------------------------------------------------------------- reporting


def phase_table(title: str, summary: dict) -> list[str]:
    cols = ("min", "median", "mean", "p90", "p95", "p99", "max")
    lines = [title, f"  {'phase (ms)':<12}" + "".join(f"{c:>9}" for c in cols)]
    for phase in (*stats.PHASES, "host_wall"):
        s = summary.get(phase)
        if s:
            lines.append(f"  {phase:<12}" + "".join(f"{s[c]:9.4f}" for c in cols))
    lines.append(
        f"  {summary['iterations']} iterations in {summary['wall_s']:.2f} s after "
        f"{summary['warmup_iterations']} warm-up ({summary['warmup_s'] * 1000:.0f} ms): "
        f"{summary['throughput_qps']:.1f} inferences/s"
    )
    return lines


def clocks_line(c: dict) -> str:
    if set(c) == {"error"}:
        return f"unavailable ({c['error']})"
    parts = [
        f"SM {c.get('sm_mhz')}/{c.get('sm_max_mhz')} MHz",
        f"memory {c.get('memory_mhz')}/{c.get('memory_max_mhz')} MHz",
        f"graphics {c.get('graphics_mhz')}/{c.get('graphics_max_mhz')} MHz",
        f"{c.get('temperature_c')} °C",
        f"{c.get('power_w', 0):.0f} W",
    ]
    return ", ".join(parts) + (f" [{c['error']}]" if "error" in c else "")


def nvml_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - clocks are extra; no NVML means none
        return None


def torch_event_times(kernel: FmaKernel, device_index: int, warmup_ms: float, duration_s: float) -> list[float] | None:
    """The kernel launch timed with torch.cuda.Event on torch's current stream (same primary context)."""
    try:
        import torch
    except ImportError:
        return None
    torch.cuda.set_device(device_index)
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def step() -> stats.Iteration:
        start.record(stream)
        kernel.launch(stream.cuda_stream)
        end.record(stream)
        end.synchronize()
        ms = start.elapsed_time(end)
        return stats.Iteration(e2e=ms, compute=ms)

    m = stats.measure(step, warmup_ms=warmup_ms, duration_s=duration_s)
    return [it.compute for it in m.iterations]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--mib", type=int, default=64, help="size of the input and of the output buffer")
    parser.add_argument("--fma", type=int, default=2000, help="dependent FMAs per element (sets the kernel time)")
    parser.add_argument("--warmup-ms", type=float, default=200)
    parser.add_argument("--duration", type=float, default=3.0, help="minimum measured seconds per mode")
    parser.add_argument("--iterations", type=int, default=10, help="minimum measured iterations per mode")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args(argv)

    out: dict[str, Any] = {"checks": {}}
    checks = out["checks"]
    with D.CudaDevice(args.device) as dev:
        free0, total = dev.mem_info()
        cc = dev.compute_capability
        out["device"] = {
            "name": dev.name,
            "compute_capability": cc,
            "pci_bus_id": dev.pci_bus_id,
            "multiprocessors": dev.attribute("MULTIPROCESSOR_COUNT"),
            "memory_total_bytes": total,
            "driver": nvml_driver_version(),
            "driver_cuda": D.CudaDevice.driver_cuda_version(),
            "nvrtc": nvrtc_version(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        }
        d = out["device"]
        print(
            f"device {args.device}: {d['name']}, compute capability {cc}, {d['multiprocessors']} SMs, "
            f"{total / 2**30:.1f} GiB, PCI {d['pci_bus_id']}"
        )
        print(
            f"driver {d['driver']} (CUDA {d['driver_cuda']}), NVRTC {d['nvrtc']}, Python {d['python']}, "
            f"numpy {d['numpy']}"
        )
        print(f"clocks before: {clocks_line(G.gpu_clocks(pci_bus_id=dev.pci_bus_id))}")

        nbytes = args.mib << 20
        n = nbytes // 4
        kernel = FmaKernel(compile_kernel(cc), args.fma)
        x_dev, y_dev = D.DeviceBuffer(nbytes), D.DeviceBuffer(nbytes)
        x_host, y_host = D.PinnedArray((n,), np.float32), D.PinnedArray((n,), np.float32)
        x_host.array[:] = np.random.default_rng(0).random(n, dtype=np.float32)
        expected = kernel.expected(x_host.array)
        kernel.bind(x_dev.ptr, y_dev.ptr, n)
        print(
            f"workload: {args.mib} MiB in, fma chain of {args.fma} steps on {n} floats, {args.mib} MiB out; "
            f"trtexec defaults: {args.warmup_ms:.0f} ms warm-up, ≥{args.duration:g} s, ≥{args.iterations} iterations\n"
        )

        results: dict[str, dict] = {}
        for graph in (False, True):
            mode = "graph" if graph else "no_graph"
            y_host.array[:] = np.nan
            pipe = G.TimedPipeline([(x_dev, x_host)], kernel.launch, [(y_host, y_dev)], cuda_graph=graph)
            try:
                m = G.benchmark_pipeline(
                    pipe,
                    dev,
                    warmup_ms=args.warmup_ms,
                    duration_s=args.duration,
                    min_iterations=args.iterations,
                    free_before=free0,
                )
            finally:
                pipe.close()
            s = results[mode] = m.summary()
            for line in phase_table(f"{'with' if graph else 'without'} CUDA graph", s):
                print(line)
            print(f"  clocks at start: {clocks_line(s['gpu_clocks'])}")
            print(f"  clocks at end:   {clocks_line(s['gpu_clocks_end'])}")
            err = float(np.max(np.abs(y_host.array - expected)))  # NaN where a value was not copied back
            ok = err <= TOLERANCE
            checks[f"output_{mode}"] = {"max_abs_error": err, "tolerance": TOLERANCE, "ok": ok}
            print(
                f"  (a) output vs numpy closed form: max |error| {err:.2e} (≤ {TOLERANCE:g}): {'OK' if ok else 'FAIL'}"
            )
            peak = s["peak_device_memory_bytes"]
            ok = peak >= 2 * nbytes
            checks[f"peak_memory_{mode}"] = {"bytes": peak, "buffers_bytes": 2 * nbytes, "ok": ok}
            print(
                f"  peak device memory over the start: {peak / 2**20:.1f} MiB (buffers {2 * nbytes / 2**20:.0f} MiB): "
                f"{'OK' if ok else 'FAIL'}\n"
            )
        out["results"] = results

        base, cg = results["no_graph"], results["graph"]
        bw = {}
        for phase in ("h2d", "d2h"):
            gbs = nbytes / (base[phase]["median"] / 1000) / 1e9
            ok = BANDWIDTH_GBS[0] <= gbs <= BANDWIDTH_GBS[1]
            bw[phase] = gbs
            checks[f"bandwidth_{phase}"] = {"gb_s": gbs, "range": BANDWIDTH_GBS, "ok": ok}
        print(
            f"(b) bandwidth from median copy times: H2D {bw['h2d']:.1f} GB/s, D2H {bw['d2h']:.1f} GB/s "
            f"(plausible {BANDWIDTH_GBS[0]:g}-{BANDWIDTH_GBS[1]:g}): "
            f"{'OK' if checks['bandwidth_h2d']['ok'] and checks['bandwidth_d2h']['ok'] else 'FAIL'}"
        )
        tflops = kernel.flops() / (base["compute"]["median"] / 1000) / 1e12
        out["kernel_tflops_fp32"] = tflops
        print(f"    kernel: {tflops:.1f} TFLOP/s FP32 at the median compute time")

        torch_ms = torch_event_times(kernel, args.device, args.warmup_ms, min(args.duration, 1.0))
        if torch_ms is None:
            print("(c) torch not importable: no torch.cuda.Event comparison")
        else:
            t = stats.summarize(torch_ms)
            ratio = t.median / base["compute"]["median"]
            ok = 0.95 <= ratio <= 1.05
            checks["torch_events"] = {
                "torch_median_ms": t.median,
                "ours_median_ms": base["compute"]["median"],
                "ratio": ratio,
                "samples": t.count,
                "ok": ok,
            }
            print(
                f"(c) torch.cuda.Event, same kernel launch: median {t.median:.4f} ms over {t.count} launches, "
                f"ours {base['compute']['median']:.4f} ms: ratio {ratio:.3f} (0.95-1.05): {'OK' if ok else 'FAIL'}"
            )

        spec = SimpleNamespace(
            warmup_ms=args.warmup_ms, duration_s=min(args.duration, 1.0), iterations=args.iterations, cuda_graph=True
        )
        with R.TensorRTEngineRunner(b"stand-in", stand_in_trt(kernel, n), args.device) as runner:
            got = runner.infer({"x": x_host.array})["y"]
            err = float(np.max(np.abs(got - expected)))
            rs = runner.benchmark({"x": x_host.array}, spec).summary()
        ratio = rs["compute"]["median"] / cg["compute"]["median"]
        ok = err <= TOLERANCE and 0.95 <= ratio <= 1.05
        checks["runner_stand_in"] = {
            "max_abs_error": err,
            "compute_median_ms": rs["compute"]["median"],
            "ratio_to_pipeline_graph": ratio,
            "iterations": rs["iterations"],
            "ok": ok,
        }
        print(
            f"(d) TensorRTEngineRunner with a stand-in engine launching the kernel: output max |error| {err:.2e}, "
            f"graph compute median {rs['compute']['median']:.4f} ms = {ratio:.3f} × the pipeline's: "
            f"{'OK' if ok else 'FAIL'}"
        )

        ratios = {
            "graph_vs_no_graph_compute": cg["compute"]["median"] / base["compute"]["median"],
            "graph_vs_no_graph_e2e": cg["e2e"]["median"] / base["e2e"]["median"],
            "host_wall_vs_event_e2e_no_graph": base["host_wall"]["median"] / base["e2e"]["median"],
            "host_wall_vs_event_e2e_graph": cg["host_wall"]["median"] / cg["e2e"]["median"],
        }
        out["ratios"] = ratios
        print("\nratios of medians (baseline: the same run)")
        for key, value in ratios.items():
            print(f"  {key:<34} {value:.4f}")

        for buf in (x_dev, y_dev, x_host, y_host):
            buf.close()
        kernel.close()

    failed = [k for k, v in checks.items() if not v["ok"]]
    print(f"\nsanity checks: {'all OK' if not failed else 'FAILED: ' + ', '.join(failed)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BackendMissing as exc:
        sys.exit(f"error: {exc}")
