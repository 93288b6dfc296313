"""Resolution's rules as a table: a machine, a candidate set, and the expected choice or rejection.

Every row cites the rule it checks (its id starts with the rule, and a rejection must be made by
that rule). Rows build engines and machines from realistic baselines (a TensorRT 10.13 engine built
on an RTX 3090 for CUDA 12.9; an RTX A6000 machine with the same TensorRT) and change only what the
rule is about. The second table checks ranking among several candidates that all run.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from enginefarm.core.choose import Evidence, Option, choose
from enginefarm.core.compat import CROSS_MAJOR, DRIVER_FLOORS, Match, Rule, judge
from enginefarm.core.domain import RTX_PORTABLE_CCS, EngineDescriptor
from enginefarm.core.machine import Machine
from enginefarm.core.wanted import Wanted

TRT = "10.13.3.9"
RTX = "1.7.1.116"
MIB = 1 << 20


def trt_engine(**kw) -> EngineDescriptor:
    base = EngineDescriptor(
        target="tensorrt/sm86",
        backend="tensorrt",
        backend_version=TRT,
        precision="fp16",
        platform="x86_64",
        compute_capability="8.6",
        compute_capabilities=["8.6"],
        gpu_name="NVIDIA GeForce RTX 3090",
        trt_version=TRT,
        cuda_version="12.9",
        driver_version="575.57.08",
        size=50 * MIB,
        sha256="a" * 64,
    )
    return replace(base, **kw)


def rtx_engine(arch: str = "sm86", **kw) -> EngineDescriptor:
    portable = arch == "portable"
    cc = None if portable else f"{arch[2:-1]}.{arch[-1]}"
    base = EngineDescriptor(
        target=f"tensorrt-rtx/{arch}",
        backend="tensorrt-rtx",
        backend_version=RTX,
        precision="fp32",
        platform="x86_64",
        compute_capability=cc,
        compute_capabilities=list(RTX_PORTABLE_CCS) if portable else [cc],
        trt_version=RTX,
        cuda_version="13.0",
        size=20 * MIB,
        sha256="b" * 64,
    )
    return replace(base, **kw)


def ort_engine(**kw) -> EngineDescriptor:
    base = EngineDescriptor(
        target="onnxruntime/cpu-x86_64",
        backend="onnxruntime",
        backend_version="1.23.2",
        precision="fp32",
        platform="x86_64",
        size=5 * MIB,
        sha256="c" * 64,
    )
    return replace(base, **kw)


ORT = "1.31.1"


def ort_cuda_engine(**kw) -> EngineDescriptor:
    """An onnxruntime/cuda-sm90 artifact prepared on an H100 with onnxruntime-gpu built for CUDA 13."""
    base = EngineDescriptor(
        target="onnxruntime/cuda-sm90",
        backend="onnxruntime",
        backend_version=ORT,
        precision="fp16",
        platform="x86_64",
        compute_capability="9.0",
        compute_capabilities=["9.0"],
        gpu_name="NVIDIA H100 80GB HBM3",
        cuda_version="13.0",
        driver_version="580.159.04",
        size=50 * MIB,
        sha256="d" * 64,
        device_memory_bytes=200 * MIB,
    )
    return replace(base, **kw)


def hopper(**kw) -> Machine:
    """A Hopper machine that runs onnxruntime-gpu."""
    base = Machine(
        gpu_name="NVIDIA H100 80GB HBM3",
        compute_capability="9.0",
        memory_mib=81559,
        driver_version="580.159.04",
        cuda_version="13.0",
        ort_version=ORT,
        ort_cuda=True,
        platform="x86_64",
    )
    return replace(base, **kw)


def machine(**kw) -> Machine:
    base = Machine(
        gpu_name="NVIDIA RTX A6000",
        compute_capability="8.6",
        memory_mib=49140,
        driver_version="575.57.08",
        cuda_version="12.9",
        trt_version=TRT,
        platform="x86_64",
        os="Linux 6.8 (Ubuntu 24.04.1 LTS)",
    )
    return replace(base, **kw)


def rtx_machine(**kw) -> Machine:
    base = Machine(
        gpu_name="NVIDIA GeForce RTX 4090",
        compute_capability="8.9",
        memory_mib=24564,
        driver_version="580.82.07",
        cuda_version="13.0",
        trt_rtx_version=RTX,
        platform="x86_64",
    )
    return replace(base, **kw)


def jetson(**kw) -> Machine:
    base = Machine(
        gpu_name="Orin",
        compute_capability="8.7",
        memory_mib=62841,
        driver_version="540.4.0",
        cuda_version="12.6",
        trt_version=TRT,
        platform="aarch64",
        jetpack="6.2",
    )
    return replace(base, **kw)


# An input 'images' built static at 1x3x640x640, or dynamic over batch 1..4 and sides 64..1024.
STATIC = {"images": {"min": [1, 3, 640, 640], "opt": [1, 3, 640, 640], "max": [1, 3, 640, 640]}}
DYNAMIC = {"images": {"min": [1, 3, 64, 64], "opt": [1, 3, 640, 640], "max": [4, 3, 1024, 1024]}}


def need(name: str, *shapes: str) -> dict:
    """A shape request in trtexec syntax: one shape, or min, opt, max."""
    lo, mid, hi = (shapes * 3)[:3] if len(shapes) == 1 else shapes
    dims = lambda s: [int(d) for d in s.split("x")]  # noqa: E731
    return {name: {"min": dims(lo), "opt": dims(mid), "max": dims(hi)}}


def profile(lo: str, mid: str, hi: str) -> dict:
    return need("images", lo, mid, hi)


E, G, HW, VC, CPU = Match.EXACT_CC, Match.EXACT_GPU, Match.HARDWARE_COMPAT, Match.VERSION_COMPAT, Match.CPU_FALLBACK
VC8 = dict(version_compatible=True, trt_version="8.6.1.6", backend_version="8.6.1.6")


def opt(
    name: str,
    engine: EngineDescriptor,
    *,
    seq: int = 1,
    accuracy: str | None = None,
    latency: float | None = None,
    spec: str = "s" * 64,
) -> Option:
    return Option(name, engine, seq, spec, Evidence(accuracy, {"gpu:NVIDIA RTX A6000": latency} if latency else {}))


def runs(rule: str, what: str, mach: Machine, engine: EngineDescriptor, match: Match, words: str):
    """One candidate that must be chosen, with this match and these words in the reason."""
    return pytest.param(mach, [opt("e", engine)], "e", match, words, None, None, id=f"{rule}: {what}")


def rejected(rule: Rule, what: str, mach: Machine, engine: EngineDescriptor, words: str):
    """One candidate that must be excluded by ``rule`` with these words in the reason."""
    return pytest.param(mach, [opt("e", engine)], None, None, words, rule, None, id=f"{rule.value}: {what}")


def falls_back(rule: Rule, what: str, mach: Machine, engine: EngineDescriptor, words: str):
    """A GPU engine excluded by ``rule`` next to a CPU artifact that is then chosen (the machine accepts one)."""
    return pytest.param(
        mach,
        [opt("e", engine), opt("cpu", ort_engine(platform=mach.platform or "x86_64"))],
        "cpu",
        CPU,
        words,
        rule,
        Wanted(accept=["cpu"]),
        id=f"{rule.value}: {what}",
    )


R = Rule
CASES = [
    # --- TensorRT version: exact, older, newer, across majors; version-compatible on and off
    runs(
        "trt-version",
        "exact TensorRT version runs",
        machine(),
        trt_engine(),
        E,
        "built for your compute capability 8.6",
    ),
    rejected(
        R.TRT_VERSION,
        "older runtime, plain engine",
        machine(trt_version="10.12.0.36"),
        trt_engine(),
        f"built with TensorRT {TRT}, you run 10.12.0.36, not version-compatible",
    ),
    rejected(
        R.TRT_VERSION,
        "older runtime even with version-compat",
        machine(trt_version="10.12.0.36"),
        trt_engine(version_compatible=True),
        "version-compatible engines never run on older runtimes",
    ),
    rejected(
        R.TRT_VERSION,
        "newer runtime without version-compat",
        machine(trt_version="10.14.1.48"),
        trt_engine(),
        f"built with TensorRT {TRT}, you run 10.14.1.48, not version-compatible",
    ),
    falls_back(
        R.TRT_VERSION,
        "a different patch build is a different version; CPU artifact chosen",
        machine(trt_version="10.13.3.10"),
        trt_engine(),
        "not version-compatible",
    ),
    runs(
        "trt-version",
        "newer same-major runtime with version-compat",
        machine(trt_version="10.14.1.48"),
        trt_engine(version_compatible=True),
        VC,
        f"version-compatible engine built with TensorRT {TRT} runs on your 10.14.1.48",
    ),
    runs(
        "trt-version",
        "cross-major 8.6 -> 10 with version-compat",
        machine(trt_version="10.3.0.26"),
        trt_engine(**VC8),
        VC,
        "built with TensorRT 8.6.1.6",
    ),
    runs(
        "trt-version",
        "cross-major 8.6 -> 9 with version-compat",
        machine(trt_version="9.2.0.5"),
        trt_engine(**VC8),
        VC,
        "built with TensorRT 8.6.1.6",
    ),
    rejected(
        R.TRT_VERSION,
        "cross-major 8.6 -> 11 is not a supported pair",
        machine(trt_version="11.0.0.114"),
        trt_engine(**VC8),
        "does not cross from 8.x to 11.x",
    ),
    rejected(
        R.TRT_VERSION,
        "version-compat needs an 8.6+ builder",
        machine(trt_version="8.6.1.6"),
        trt_engine(version_compatible=True, trt_version="8.5.3.1", backend_version="8.5.3.1"),
        "needs 8.6 or newer on both sides",
    ),
    runs(
        "trt-version",
        "cross-major 10 -> 11 with version-compat",
        machine(trt_version="11.0.0.114"),
        trt_engine(version_compatible=True),
        VC,
        "version-compatible engine",
    ),
    rejected(
        R.TRT_VERSION,
        "cross-major 10 -> 12",
        machine(trt_version="12.0.0.1"),
        trt_engine(version_compatible=True),
        "version compatibility does not cross from 10.x to 12.x",
    ),
    rejected(
        R.TRT_VERSION,
        "cross-major 10 -> 11 without version-compat",
        machine(trt_version="11.0.0.114"),
        trt_engine(),
        "not version-compatible",
    ),
    rejected(
        R.TRT_VERSION,
        "an 11 engine on a 10 runtime",
        machine(),
        trt_engine(version_compatible=True, trt_version="11.0.0.114", backend_version="11.0.0.114"),
        "older",
    ),
    # --- lean runtime
    rejected(
        R.LEAN_RUNTIME,
        "plain engine, even at the same version",
        machine(lean_runtime=True),
        trt_engine(),
        "loads only version-compatible engines",
    ),
    runs(
        "lean-runtime",
        "version-compatible engine at the same version",
        machine(lean_runtime=True),
        trt_engine(version_compatible=True),
        E,
        "compute capability 8.6",
    ),
    runs(
        "lean-runtime",
        "version-compatible engine on a newer lean runtime",
        machine(lean_runtime=True, trt_version="10.14.1.48"),
        trt_engine(version_compatible=True),
        VC,
        "version-compatible engine",
    ),
    # --- runtime absent: a fingerprint that names runtimes names all of them
    falls_back(
        R.RUNTIME,
        "TensorRT engine on a TensorRT-RTX-only machine",
        rtx_machine(compute_capability="8.6"),
        trt_engine(),
        "you run no TensorRT runtime (only TensorRT-RTX",
    ),
    rejected(
        R.RUNTIME,
        "TensorRT-RTX engine on a TensorRT-only machine",
        machine(),
        rtx_engine("sm86"),
        "you run no TensorRT-RTX runtime (only TensorRT 10.13.3.9)",
    ),
    # --- compute capabilities 7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 12.0 and hardware compatibility
    runs(
        "compute-capability",
        "7.5: sm75 engine on a T4",
        machine(compute_capability="7.5", gpu_name="Tesla T4"),
        trt_engine(compute_capability="7.5", gpu_name="Tesla T4"),
        G,
        "built on your GPU model, Tesla T4",
    ),
    rejected(
        R.COMPUTE_CAPABILITY,
        "7.5 machine, 8.6 engine",
        machine(compute_capability="7.5", gpu_name="Tesla T4"),
        trt_engine(),
        "built for compute capability 8.6, you have 7.5",
    ),
    runs(
        "compute-capability",
        "8.0: sm80 engine on another A100 model",
        machine(compute_capability="8.0", gpu_name="NVIDIA A100-SXM4-80GB"),
        trt_engine(compute_capability="8.0", gpu_name="NVIDIA A100-PCIE-40GB"),
        E,
        "on an NVIDIA A100-PCIE-40GB, not your NVIDIA A100-SXM4-80GB",
    ),
    rejected(
        R.COMPUTE_CAPABILITY,
        "8.9 machine, plain 8.6 engine",
        machine(compute_capability="8.9", gpu_name="NVIDIA L40S"),
        trt_engine(),
        "built for compute capability 8.6, you have 8.9, not hardware-compatible",
    ),
    runs(
        "hardware-compat",
        "Ampere+ 8.6 engine on an 8.9 discrete GPU",
        machine(compute_capability="8.9", gpu_name="NVIDIA L40S"),
        trt_engine(hardware_compat="ampere_plus"),
        HW,
        "Ampere+ hardware-compatible engine built on 8.6 runs on your 8.9",
    ),
    runs(
        "hardware-compat",
        "9.0: Ampere+ 8.6 engine on an H100",
        machine(compute_capability="9.0", gpu_name="NVIDIA H100 80GB HBM3"),
        trt_engine(hardware_compat="ampere_plus"),
        HW,
        "Ampere+",
    ),
    runs(
        "compute-capability",
        "9.0: sm90 engine built on an H100 runs on an H200",
        machine(compute_capability="9.0", gpu_name="NVIDIA H200", cuda_version="13.0", driver_version="580.159.04"),
        trt_engine(compute_capability="9.0", gpu_name="NVIDIA H100 80GB HBM3", cuda_version="13.0"),
        E,
        "built for your compute capability 9.0",
    ),
    rejected(
        R.HARDWARE_COMPAT,
        "Ampere+ on 7.5",
        machine(compute_capability="7.5", gpu_name="Tesla T4"),
        trt_engine(hardware_compat="ampere_plus"),
        "needs compute capability 8.0 or newer; you have 7.5",
    ),
    rejected(
        R.HARDWARE_COMPAT,
        "8.7: Ampere+ on Jetson",
        jetson(),
        trt_engine(hardware_compat="ampere_plus", platform="aarch64", compute_capability="8.0"),
        "Jetson does not support",
    ),
    runs(
        "compute-capability",
        "8.7: Jetson engine on the same Jetson module",
        jetson(),
        trt_engine(platform="aarch64", compute_capability="8.7", gpu_name="Orin", cuda_version="12.6"),
        G,
        "built on your GPU model, Orin",
    ),
    rejected(
        R.PLATFORM, "8.7: a discrete-GPU engine on Jetson", jetson(), trt_engine(), "built for x86_64, you run aarch64"
    ),
    runs(
        "hardware-compat",
        "Ampere+ on its own cc is an exact-cc match",
        machine(),
        trt_engine(hardware_compat="ampere_plus"),
        E,
        "built for your compute capability 8.6",
    ),
    rejected(
        R.COMPUTE_CAPABILITY,
        "same_compute_capability does not cross cc",
        machine(compute_capability="8.9"),
        trt_engine(hardware_compat="same_compute_capability"),
        "not hardware-compatible",
    ),
    runs(
        "hardware-compat",
        "same_compute_capability runs on another GPU of that cc",
        machine(gpu_name="NVIDIA A40"),
        trt_engine(hardware_compat="same_compute_capability"),
        E,
        "built for your compute capability 8.6",
    ),
    runs(
        "hardware-compat",
        "Ampere+ and version-compat: both named, ranked version-compat",
        machine(compute_capability="8.9", trt_version="10.14.1.48"),
        trt_engine(hardware_compat="ampere_plus", version_compatible=True),
        VC,
        "version-compatible engine built with TensorRT 10.13.3.9 runs on your 10.14.1.48; "
        "Ampere+ hardware-compatible engine built on 8.6 runs on your 8.9",
    ),
    # --- platform
    rejected(
        R.PLATFORM,
        "x86_64 engine on aarch64",
        machine(platform="aarch64"),
        trt_engine(),
        "built for x86_64, you run aarch64",
    ),
    rejected(
        R.PLATFORM,
        "aarch64 engine on x86_64",
        machine(),
        trt_engine(platform="aarch64"),
        "built for aarch64, you run x86_64",
    ),
    rejected(
        R.PLATFORM,
        "the CPU artifact's platform applies too",
        machine(platform="aarch64"),
        ort_engine(),
        "built for x86_64, you run aarch64",
    ),
    # --- driver floors (CUDA minor-version compatibility)
    runs(
        "driver-floor",
        "CUDA 12 on driver 525",
        machine(driver_version="525.60.13"),
        trt_engine(),
        E,
        "compute capability",
    ),
    rejected(
        R.DRIVER,
        "CUDA 12 on driver 520",
        machine(driver_version="520.61.05"),
        trt_engine(),
        "built with CUDA 12.9, which needs driver 525 or newer; you have 520.61.05",
    ),
    runs(
        "driver-floor",
        "CUDA 13 on driver 580",
        machine(driver_version="580.65.06"),
        trt_engine(cuda_version="13.0"),
        E,
        "compute capability",
    ),
    rejected(
        R.DRIVER,
        "CUDA 13 on driver 575",
        machine(driver_version="575.57.08"),
        trt_engine(cuda_version="13.0"),
        "needs driver 580 or newer",
    ),
    rejected(
        R.DRIVER,
        "CUDA 11 on driver 440",
        machine(driver_version="440.33.01"),
        trt_engine(cuda_version="11.8"),
        "needs driver 450 or newer",
    ),
    falls_back(
        R.DRIVER,
        "TensorRT-RTX CUDA 13 engine on driver 570; CPU artifact chosen",
        rtx_machine(driver_version="570.172.08"),
        rtx_engine("sm89"),
        "needs driver 580 or newer",
    ),
    # --- TensorRT-RTX: specific and portable engines
    runs(
        "rtx-cc",
        "8.9: same release and cc",
        rtx_machine(),
        rtx_engine("sm89"),
        E,
        "built for your compute capability 8.9",
    ),
    runs(
        "rtx-cc",
        "12.0: sm120 engine on an RTX 5090",
        rtx_machine(compute_capability="12.0", gpu_name="NVIDIA GeForce RTX 5090"),
        rtx_engine("sm120"),
        E,
        "compute capability 12.0",
    ),
    rejected(
        R.RTX_RELEASE,
        "a different release",
        rtx_machine(trt_rtx_version="1.6.0.45"),
        rtx_engine("sm89"),
        "TensorRT-RTX engines do not load across releases",
    ),
    rejected(
        R.RTX_CC,
        "cc mismatch",
        rtx_machine(),
        rtx_engine("sm86"),
        "TensorRT-RTX engine built for compute capability 8.6, you have 8.9",
    ),
    runs("rtx-cc", "portable engine on 8.9", rtx_machine(), rtx_engine("portable"), HW, "portable TensorRT-RTX engine"),
    runs(
        "rtx-cc",
        "8.0: portable engine on an A100",
        rtx_machine(compute_capability="8.0", gpu_name="NVIDIA A100-SXM4-80GB"),
        rtx_engine("portable"),
        HW,
        "runs on 8.0, 8.6, 8.9, 12.0, 12.1",
    ),
    rejected(
        R.RTX_CC,
        "portable engine on 7.5 (Turing)",
        rtx_machine(compute_capability="7.5"),
        rtx_engine("portable"),
        "you have 7.5",
    ),
    rejected(
        R.RTX_CC,
        "9.0: portable engine on Hopper",
        rtx_machine(compute_capability="9.0", gpu_name="NVIDIA H100"),
        rtx_engine("portable"),
        "portable TensorRT-RTX engine runs on 8.0, 8.6, 8.9, 12.0, 12.1, you have 9.0",
    ),
    rejected(
        R.RTX_CC,
        "8.7: no TensorRT-RTX engine runs on Jetson",
        jetson(trt_version=None, trt_rtx_version=RTX, platform="x86_64"),
        rtx_engine("sm86"),
        "you have 8.7",
    ),
    runs(
        "rtx-cc",
        "7.5: explicit sm75 engine on Turing",
        rtx_machine(compute_capability="7.5"),
        rtx_engine("sm75"),
        E,
        "compute capability 7.5",
    ),
    # --- memory
    falls_back(
        R.MEMORY,
        "engine larger than the GPU; CPU artifact chosen",
        machine(memory_mib=4096),
        trt_engine(size=6 << 30),
        "engine needs at least 6144 MiB (plan), your GPU has 4096 MiB",
    ),
    rejected(
        R.MEMORY,
        "plan plus activation memory too large",
        machine(memory_mib=4096),
        trt_engine(size=3 << 30, device_memory_bytes=2 << 30),
        "5120 MiB (plan and activations)",
    ),
    runs("memory", "engine that fits", machine(memory_mib=4096), trt_engine(size=3 << 30), E, "compute capability"),
    # --- no GPU: a GPU engine needs the machine's compute capability
    falls_back(
        R.COMPUTE_CAPABILITY,
        "a machine with no GPU gets the CPU artifact",
        Machine(platform="x86_64"),
        trt_engine(),
        "your GPU's compute capability is unknown",
    ),
    rejected(
        R.RTX_CC,
        "a TensorRT-RTX engine for a machine with no GPU",
        Machine(platform="x86_64", trt_rtx_version=RTX),
        rtx_engine("sm86"),
        "a GPU engine needs it",
    ),
    # --- ONNX Runtime CPU artifact
    runs(
        "platform",
        "CPU artifact on a machine without GPU",
        Machine(platform="x86_64"),
        ort_engine(),
        CPU,
        "ONNX Runtime CPU artifact for x86_64",
    ),
    runs(
        "platform",
        "CPU artifact on a GPU machine that names no runtime, when it is all there is",
        machine(trt_version=None),
        ort_engine(),
        CPU,
        "ONNX Runtime",
    ),
    # --- the caller's filters
    pytest.param(
        machine(),
        [opt("e", trt_engine())],
        None,
        None,
        "built fp16, you asked for fp32",
        R.PRECISION,
        Wanted(precision="fp32"),
        id="filter:precision: wrong precision excluded",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine())],
        None,
        None,
        "has no accuracy result yet",
        R.ACCURACY,
        Wanted(accuracy="pass"),
        id="filter:accuracy: unchecked engine excluded by accuracy=pass",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine(), latency=7.5)],
        None,
        None,
        "median latency 7.5 ms",
        R.LATENCY,
        Wanted(max_latency_ms=5),
        id="filter:max-latency: slower than asked excluded",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine())],
        None,
        None,
        "no latency measured on your GPU model",
        R.LATENCY,
        Wanted(max_latency_ms=5),
        id="filter:max-latency: unmeasured engine excluded",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine(), spec="a" * 64)],
        None,
        None,
        "you asked for bbbbbbbbbbbb",
        R.SPEC,
        Wanted(spec_hash="b" * 64),
        id="filter:spec-hash: another spec excluded",
    ),
    pytest.param(
        machine(),
        [opt("e", rtx_engine("sm86"))],
        None,
        None,
        "built for tensorrt-rtx, you asked for tensorrt",
        R.BACKEND,
        Wanted(backend="tensorrt"),
        id="filter:backend: another backend excluded",
    ),
    # --- shapes: what the machine will run against the engine's optimization profiles
    runs(
        "shapes",
        "a static request inside the dynamic profile",
        machine(shapes=need("images", "1x3x640x640")),
        trt_engine(profiles=[DYNAMIC]),
        E,
        "built for your compute capability 8.6",
    ),
    rejected(
        R.SHAPES,
        "a batch the static profile does not cover",
        machine(shapes=need("images", "4x3x640x640")),
        trt_engine(profiles=[STATIC]),
        "profile 0 of input 'images' covers 1x3x640x640..1x3x640x640; you need 4x3x640x640",
    ),
    rejected(
        R.SHAPES,
        "a range wider than the profile",
        machine(shapes=need("images", "1x3x320x320", "1x3x640x640", "1x3x2048x2048")),
        trt_engine(profiles=[DYNAMIC]),
        "profile 0 of input 'images' covers 1x3x64x64..4x3x1024x1024; you need 1x3x320x320..1x3x2048x2048",
    ),
    rejected(
        R.SHAPES,
        "an input no profile has",
        machine(shapes=need("image", "1x3x640x640")),
        trt_engine(profiles=[DYNAMIC]),
        "profile 0 has no input 'image' (it has images)",
    ),
    rejected(
        R.SHAPES,
        "another rank",
        machine(shapes=need("images", "3x640x640")),
        trt_engine(profiles=[DYNAMIC]),
        "you need 3x640x640",
    ),
    falls_back(
        R.SHAPES,
        "no profile of two covers it; the CPU artifact runs any shape",
        machine(shapes=need("images", "8x3x640x640")),
        trt_engine(profiles=[STATIC, DYNAMIC]),
        "profile 1 of input 'images' covers 1x3x64x64..4x3x1024x1024; you need 8x3x640x640",
    ),
    # --- ONNX Runtime with its CUDA provider: a prepared graph, no GPU code
    runs(
        "ort-cuda",
        "the GPU model it was prepared on",
        hopper(),
        ort_cuda_engine(),
        G,
        "ONNX Runtime CUDA graph prepared on your GPU model, NVIDIA H100 80GB HBM3",
    ),
    runs(
        "ort-cuda",
        "another GPU of the same compute capability",
        hopper(gpu_name="NVIDIA H200"),
        ort_cuda_engine(),
        E,
        "prepared for your compute capability 9.0",
    ),
    runs(
        "ort-cuda",
        "another compute capability the CUDA 13 build supports",
        hopper(compute_capability="8.6"),
        ort_cuda_engine(),
        HW,
        "prepared on 9.0 runs on your 8.6",
    ),
    runs(
        "ort-version",
        "a later ONNX Runtime",
        hopper(ort_version="1.32.0"),
        ort_cuda_engine(),
        VC,
        "runs on your later 1.32.0",
    ),
    rejected(
        R.ORT_CUDA,
        "a GPU machine that did not say it runs ONNX Runtime with CUDA",
        machine(),
        ort_cuda_engine(),
        "you did not say you run ONNX Runtime with CUDA",
    ),
    rejected(
        R.ORT_CUDA,
        "ONNX Runtime without CUDA",
        hopper(ort_cuda=False),
        ort_cuda_engine(),
        f"you run ONNX Runtime {ORT} without CUDA",
    ),
    rejected(
        R.COMPUTE_CAPABILITY,
        "below what CUDA 13 runs on",
        hopper(compute_capability="7.0"),
        ort_cuda_engine(),
        "runs on compute capability 7.5 or newer; you have 7.0",
    ),
    rejected(
        R.ORT_VERSION,
        "an older ONNX Runtime",
        hopper(ort_version="1.30.0"),
        ort_cuda_engine(),
        "you run the older 1.30.0",
    ),
    rejected(
        R.DRIVER,
        "a driver below CUDA 13's floor",
        hopper(driver_version="575.57.08"),
        ort_cuda_engine(),
        "needs driver 580 or newer",
    ),
    rejected(R.MEMORY, "more than the GPU has", hopper(memory_mib=100), ort_cuda_engine(), "your GPU has 100 MiB"),
    falls_back(
        R.COMPUTE_CAPABILITY,
        "ort-cuda: no GPU said, the CPU artifact",
        hopper(compute_capability=None, gpu_name=None),
        ort_cuda_engine(),
        "a GPU engine needs it",
    ),
    # --- the precision policy: failed and unchecked int8/fp8 engines are not picked by default
    pytest.param(
        machine(),
        [opt("e", trt_engine(), accuracy="fail")],
        None,
        None,
        "failed its accuracy check",
        R.ACCURACY_GATE,
        None,
        id="accuracy-gate: a failed engine is never the default answer",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine(precision="int8")), opt("fp32", trt_engine(precision="fp32"))],
        "fp32",
        E,
        "int8 engine's accuracy was never checked",
        R.ACCURACY_GATE,
        None,
        id="accuracy-gate: an unchecked int8 engine is not picked by default",
    ),
    pytest.param(
        machine(),
        [opt("e", trt_engine(precision="fp8"))],
        None,
        None,
        "accept=unchecked",
        R.ACCURACY_GATE,
        None,
        id="accuracy-gate: nor an unchecked fp8 one",
    ),
    pytest.param(
        machine(precisions=["fp16"]),
        [opt("e", trt_engine(precision="fp32"))],
        None,
        None,
        "built fp32; your machine accepts fp16",
        R.ACCEPTED_PRECISION,
        None,
        id="precision: a precision the machine does not accept",
    ),
    # --- a machine that names its GPU runtime is handed that runtime's engines, a CPU artifact only when it asks
    rejected(
        R.NAMED_RUNTIME,
        "an ONNX Runtime file to a TensorRT machine",
        machine(),
        ort_engine(),
        "your machine names TensorRT: add accept=cpu",
    ),
    rejected(
        R.NAMED_RUNTIME,
        "an ONNX Runtime file to a TensorRT-RTX machine",
        rtx_machine(),
        ort_engine(),
        "your machine names TensorRT-RTX: add accept=cpu",
    ),
    rejected(
        R.NAMED_RUNTIME,
        "the CPU file to a machine that runs ONNX Runtime with CUDA",
        machine(trt_version=None, ort_cuda=True),
        ort_engine(),
        "your machine names ONNX Runtime CUDA",
    ),
    pytest.param(
        rtx_machine(),
        [opt("e", ort_engine())],
        "e",
        CPU,
        "ONNX Runtime CPU artifact",
        None,
        Wanted(backend="onnxruntime"),
        id="named-runtime: naming the backend is asking for it",
    ),
    runs(
        "named-runtime",
        "a machine that names no GPU runtime may get it",
        Machine(compute_capability="8.6", platform="x86_64"),
        ort_engine(),
        CPU,
        "ONNX Runtime CPU artifact",
    ),
]


@pytest.mark.parametrize("mach, options, chosen, match, words, rule, wanted", CASES)
def test_resolution_table(mach, options, chosen, match, words, rule, wanted):
    choice = choose(options, mach, wanted)
    if chosen is None:
        assert choice.chosen is None, choice.chosen.verdict.reason
    else:
        assert choice.chosen is not None, [j.verdict.reason for j in choice.rejected]
        assert choice.chosen.option.id == chosen
        assert choice.chosen.verdict.match == match
    if rule is None:
        assert words in choice.chosen.verdict.reason
        return
    out = next(j for j in choice.rejected if j.option.id == "e")
    assert out.verdict.rule is rule, out.verdict.checks
    assert words in out.verdict.reason
    assert out.rank is None and not out.verdict.runs


def test_table_covers_every_rule_and_compute_capability():
    assert len(CASES) >= 40
    ids = " ".join(c.id for c in CASES)
    for rule in Rule:
        assert f"{rule.value}:" in ids, rule
    for cc in ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "12.0"):
        assert any(cc in c.id or (c.values[0].compute_capability == cc) for c in CASES), cc


# --- ranking among engines that all run: (machine, candidates, expected order)
RANKING = [
    pytest.param(
        machine(gpu_name="NVIDIA GeForce RTX 3090", trt_version=None),
        [opt("cc", trt_engine(gpu_name="NVIDIA RTX A6000")), opt("gpu", trt_engine()), opt("cpu", ort_engine())],
        ["gpu", "cc", "cpu"],
        id="exact GPU model beats exact cc beats the CPU artifact",
    ),
    pytest.param(
        machine(compute_capability="8.9", gpu_name="NVIDIA L40S", trt_version="10.14.1.48"),
        [
            opt("vc", trt_engine(compute_capability="8.9", version_compatible=True)),
            opt(
                "hw", trt_engine(hardware_compat="ampere_plus", trt_version="10.14.1.48", backend_version="10.14.1.48")
            ),
            opt("exact", trt_engine(compute_capability="8.9", trt_version="10.14.1.48", backend_version="10.14.1.48")),
        ],
        ["exact", "hw", "vc"],
        id="exact cc beats Ampere+ beats version-compatible",
    ),
    pytest.param(
        machine(),
        [opt("none", trt_engine(), seq=2), opt("pass", trt_engine(), accuracy="pass")],
        ["pass", "none"],
        id="passed accuracy beats unbenchmarked, whatever the version",
    ),
    pytest.param(
        machine(),
        [opt("fp32", trt_engine(precision="fp32"), seq=2), opt("int8", trt_engine(precision="int8"), accuracy="pass")],
        ["int8", "fp32"],
        id="an int8 engine that passed its accuracy check is picked",
    ),
    pytest.param(
        machine(shapes=need("images", "1x3x640x640")),
        [opt("dynamic", trt_engine(profiles=[DYNAMIC])), opt("static", trt_engine(profiles=[STATIC]))],
        ["static", "dynamic"],
        id="shapes: the narrowest covering profile wins",
    ),
    pytest.param(
        machine(shapes=need("images", "2x3x512x512")),
        [
            opt("wide", trt_engine(profiles=[profile("1x3x64x64", "1x3x640x640", "4x3x1024x1024")])),
            opt("two", trt_engine(profiles=[STATIC, profile("1x3x256x256", "2x3x512x512", "4x3x768x768")])),
        ],
        ["two", "wide"],
        id="shapes: of two profiles the covering one counts, and it is narrower",
    ),
    pytest.param(
        machine(shapes=need("images", "1x3x512x512")),
        [
            opt("far", trt_engine(profiles=[profile("1x3x64x64", "1x3x1024x1024", "1x3x1024x1024")])),
            opt("near", trt_engine(profiles=[profile("1x3x64x64", "1x3x512x512", "1x3x1024x1024")])),
        ],
        ["near", "far"],
        id="shapes: equally narrow, the opt nearest the request wins",
    ),
    pytest.param(
        machine(),
        [
            opt("slow", trt_engine(), latency=4.0, seq=2),
            opt("fast", trt_engine(), latency=2.5),
            opt("unmeasured", trt_engine(), seq=3),
        ],
        ["fast", "slow", "unmeasured"],
        id="lower latency on the same GPU model ranks higher",
    ),
    pytest.param(
        machine(),
        [opt("v1", trt_engine(), seq=1), opt("v3", trt_engine(), seq=3), opt("v2", trt_engine(), seq=2)],
        ["v3", "v2", "v1"],
        id="the newer model version ranks higher",
    ),
    pytest.param(
        machine(gpu_name="NVIDIA GeForce RTX 3090"),
        [opt("v2-cc", trt_engine(gpu_name="NVIDIA RTX A6000"), seq=2), opt("v1-gpu", trt_engine(), seq=1)],
        ["v1-gpu", "v2-cc"],
        id="match outranks model version (pin version=latest to avoid)",
    ),
    pytest.param(
        rtx_machine(),
        [opt("portable", rtx_engine("portable")), opt("sm89", rtx_engine("sm89"))],
        ["sm89", "portable"],
        id="TensorRT-RTX: a specific engine beats a portable one",
    ),
]


@pytest.mark.parametrize("mach, options, order", RANKING)
def test_ranking(mach, options, order):
    choice = choose(options, mach)
    assert [j.option.id for j in choice.ranked] == order
    assert [j.rank for j in choice.ranked] == list(range(1, len(order) + 1))
    assert not choice.rejected


def test_precision_policy_overrides():
    """Unchecked int8 runs when asked for by name or with accept=unchecked, and the answer says it is unchecked;
    a failed engine only with accept=failed, ranked last."""
    int8 = [opt("int8", trt_engine(precision="int8"))]
    for wanted, mach in (
        (Wanted(precision="int8"), machine()),
        (Wanted(accept=["unchecked"]), machine()),
        (None, machine(precisions=["int8"])),
    ):
        choice = choose(int8, mach, wanted)
        assert choice.chosen is not None, (wanted, [j.verdict.reason for j in choice.rejected])
        assert "accuracy-gate" in choice.chosen.verdict.unchecked
    fp16 = choose([opt("fp16", trt_engine())], machine())
    assert fp16.chosen is not None and "accuracy-gate" in fp16.chosen.verdict.unchecked  # served, marked unchecked
    failed = [opt("fail", trt_engine(), accuracy="fail", seq=3), opt("none", trt_engine())]
    assert [j.option.id for j in choose(failed, machine(), Wanted(accept=["failed"])).ranked] == [
        "none",
        "fail",
    ]
    assert [j.option.id for j in choose(failed, machine()).ranked] == ["none"]


def test_shape_checks_are_reported_only_when_the_machine_gives_shapes():
    assert "shapes" not in [c.rule.value for c in judge(trt_engine(profiles=[STATIC]), machine()).checks]
    v = judge(trt_engine(), machine(shapes=need("images", "1x3x640x640")))  # profiles not recorded
    assert v.runs and "shapes" in v.unchecked
    ok = judge(trt_engine(profiles=[STATIC, DYNAMIC]), machine(shapes=need("images", "2x3x640x640")))
    assert ok.runs and any(c.rule is Rule.SHAPES and "profile 1" in c.detail for c in ok.checks)


def test_unknown_machine_fields_are_listed_as_unchecked():
    v = judge(trt_engine(), Machine(compute_capability="8.6"))
    assert v.runs and v.match is Match.EXACT_CC
    assert v.unchecked == ["platform", "trt-version", "driver-floor", "memory"]
    assert judge(ort_engine(), Machine()).unchecked == ["platform"]
    v = judge(
        rtx_engine("sm89"),
        Machine(platform="x86_64", compute_capability="8.9", driver_version="580.1", memory_mib=8000),
    )
    assert v.runs and v.unchecked == ["rtx-release"]


def test_every_check_is_reported_even_after_a_failure():
    v = judge(trt_engine(cuda_version="13.0"), machine(platform="aarch64", driver_version="575.1", memory_mib=10))
    failed = [c.rule for c in v.checks if c.outcome == "fail"]
    assert failed == [Rule.PLATFORM, Rule.DRIVER, Rule.MEMORY]
    assert v.rule is Rule.PLATFORM and v.reason == "built for x86_64, you run aarch64"


def test_match_order_and_labels():
    assert G < E < HW < VC < CPU
    assert [m.label for m in Match] == ["exact_gpu", "exact_cc", "hardware_compat", "version_compat", "cpu_fallback"]


def test_rule_tables():
    assert DRIVER_FLOORS == {11: 450, 12: 525, 13: 580}
    assert (
        (8, 10) in CROSS_MAJOR
        and (10, 11) in CROSS_MAJOR
        and (8, 11) not in CROSS_MAJOR
        and (10, 12) not in CROSS_MAJOR
    )


# --- ranking by what was measured: CPU artifacts of one model, int8 beside fp32
XEON, EPYC = "cpu:Intel(R) Xeon(R) Platinum 8480+", "cpu:AMD EPYC 9654"
SMALL, BIG = '{"x":[2,3,32,96]}', '{"x":[4,3,48,192]}'  # two builds' opt shapes, each measured there


def cpu_opt(name: str, precision: str, latencies: dict[str, float] | None = None, **kw) -> Option:
    return Option(
        name,
        ort_engine(precision=precision),
        kw.pop("seq", 1),
        "s" * 64,
        Evidence(kw.pop("accuracy", "pass"), latencies or {}, kw.pop("shapes", {})),
    )


CPU_BOX = Machine(platform="x86_64", cpu_name=XEON.removeprefix("cpu:"))
MEASURED = [
    pytest.param(
        CPU_BOX,
        [cpu_opt(8, "int8", {XEON: 9.0}), cpu_opt(1, "fp32", {XEON: 6.0})],
        [1, 8],
        "fastest measured on the CPU Intel",
        id="an int8 artifact measured slower than fp32 loses, newer or not",
    ),
    pytest.param(
        CPU_BOX,
        [cpu_opt(1, "fp32", {XEON: 6.0}), cpu_opt(8, "int8", {XEON: 2.5})],
        [8, 1],
        "engine 8 (onnxruntime/cpu-x86_64 int8) 2.5 ms",
        id="an int8 artifact measured faster wins",
    ),
    pytest.param(
        CPU_BOX,
        [cpu_opt(8, "int8", {XEON: 2.5}), cpu_opt(1, "fp32")],
        [1, 8],
        "not every engine was measured",
        id="int8 measured, fp32 not: no comparison, fp32 first",
    ),
    pytest.param(
        CPU_BOX,
        [cpu_opt(8, "int8", seq=2), cpu_opt(1, "fp32")],
        [1, 8],
        "fp32/fp16 rank before int8/fp8",
        id="nothing measured: fp32 before a newer int8",
    ),
    pytest.param(
        CPU_BOX,
        [
            cpu_opt(8, "int8", {EPYC: 2.0, XEON: 2.0}),
            cpu_opt(1, "fp32", {EPYC: 4.0, XEON: 1.0}),
            cpu_opt(2, "fp16", {EPYC: 3.0}),
        ],
        [8, 2, 1],
        "on the CPU AMD EPYC",
        id="compared on the CPU that measured them all, not a mix of CPUs",
    ),
    pytest.param(
        Machine(platform="x86_64"),
        [cpu_opt(8, "int8", {EPYC: 2.0}), cpu_opt(1, "fp32", {EPYC: 4.0})],
        [8, 1],
        "on the CPU AMD EPYC",
        id="a machine that names no CPU: the farm's CPU measurements",
    ),
    pytest.param(
        CPU_BOX,
        [cpu_opt(8, "int8", {XEON: 0.79}, shapes={XEON: SMALL}), cpu_opt(1, "fp32", {XEON: 1.28}, shapes={XEON: BIG})],
        [1, 8],
        "measured only at other input shapes",
        id="int8 measured at a smaller input than fp32: not compared, fp32 first",
    ),
    pytest.param(
        CPU_BOX,
        [
            cpu_opt(8, "int8", {XEON: 0.79}, shapes={XEON: SMALL}),
            cpu_opt(1, "fp32", {XEON: 1.28}, shapes={XEON: BIG}),
            cpu_opt(9, "int8", {XEON: 1.1}, shapes={XEON: BIG}),
        ],
        [1, 9, 8],
        "engine 9 (onnxruntime/cpu-x86_64 int8) 1.1 ms, engine 8 (onnxruntime/cpu-x86_64 int8) measured only at other",
        id="compared at the shapes most were measured at; one measured elsewhere counts as unmeasured",
    ),
]


@pytest.mark.parametrize("mach, options, order, words", MEASURED)
def test_ranking_by_measurement(mach, options, order, words):
    choice = choose(options, mach)
    assert [j.option.id for j in choice.ranked] == order
    assert words in choice.ranked_by, choice.ranked_by


def test_gpu_latency_counts_only_on_the_asking_gpu_model_or_its_compute_capability():
    h100 = {"gpu:NVIDIA H100 80GB HBM3": 0.5, "cc:9.0": 0.5}
    a6000 = {"gpu:NVIDIA RTX A6000": 3.0, "cc:8.6": 3.0}
    slow_here = Option("measured-elsewhere", trt_engine(), 1, "s" * 64, Evidence(None, h100))
    measured_here = Option("measured-here", trt_engine(), 1, "s" * 64, Evidence(None, a6000))
    choice = choose([slow_here, measured_here], machine())
    assert [j.option.id for j in choice.ranked] == ["measured-here", "measured-elsewhere"]
    assert choice.ranked[0].option.evidence.latency_on == "NVIDIA RTX A6000"
    assert choice.ranked[1].option.evidence.latency_ms is None  # an H100 figure says nothing about an A6000
    # Another GPU model of the same compute capability counts, under its cc.
    other = choose([measured_here], machine(gpu_name="NVIDIA RTX A40"))
    assert other.chosen.option.evidence.latency_on == "compute capability 8.6"


def test_a_machine_that_runs_onnxruntime_cuda_is_offered_that_target_to_build():
    from api.services.machinebuilds import targets_for_machine

    hopper = Machine(gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0", platform="x86_64", ort_cuda=True)
    assert [str(t) for t in targets_for_machine(hopper)] == ["onnxruntime/cuda-sm90"]
    assert "onnxruntime/cuda-sm90" not in [str(t) for t in targets_for_machine(replace(hopper, ort_cuda=False))]


def test_the_kept_kind_checks_judge_as_a_fresh_judgement_and_the_engines_own_facts_still_count():
    """judge keeps the checks of an engine's kind on a machine's kind; an engine's size and profiles, and the
    machine's memory and shapes, are judged every time."""
    from enginefarm.core import compat

    small = machine(memory_mib=1024, shapes={"input": [1, 3]})
    profile = [{"input": {"min": [1, 3], "opt": [1, 3], "max": [4, 3]}}]
    cases = [
        (trt_engine(size=10 * MIB, profiles=profile), small, True),
        (trt_engine(size=4096 * MIB, profiles=profile), small, False),  # same kind, too big for this GPU
        (trt_engine(size=10 * MIB, profiles=[{"input": {"min": [2, 3], "opt": [2, 3], "max": [4, 3]}}]), small, False),
        (trt_engine(size=10 * MIB, profiles=profile), machine(), True),
        (trt_engine(trt_version="10.3.0.30", backend_version="10.3.0.30"), machine(), False),  # another kind
    ]
    compat._kinds.clear()
    fresh = []
    for e, m, _ in cases:
        compat._kinds.clear()
        fresh.append(judge(e, m))
    kept = [judge(e, m) for e, m, _ in cases]  # the second and later of a kind come from what was kept
    assert len(compat._kinds) < len(cases)
    assert kept == fresh
    assert [v.runs for v in kept] == [runs for _, _, runs in cases]
    assert [v.rule for v in kept[1:3]] == [Rule.MEMORY, Rule.SHAPES]
    kept[0].checks.append(kept[0].checks[0])  # a verdict's list is its own
    assert judge(*cases[0][:2]) == fresh[0]


@pytest.mark.parametrize("mach, options, chosen, match, words, rule, wanted", CASES)
def test_choosing_without_every_check_gives_the_same_choice_rules_and_reasons(
    mach, options, chosen, match, words, rule, wanted
):
    """An answer without explain judges an engine whose kind fails on the machine by its kind alone: the same
    engines run, rank and are rejected, by the same rule and for the same reason, as with every check judged."""
    full, short = choose(options, mach, wanted), choose(options, mach, wanted, checks=False)
    assert [(j.option.id, j.rank, j.verdict.match, j.verdict.reason) for j in short.ranked] == [
        (j.option.id, j.rank, j.verdict.match, j.verdict.reason) for j in full.ranked
    ]
    assert [(j.option.id, j.verdict.rule, j.verdict.reason) for j in short.rejected] == [
        (j.option.id, j.verdict.rule, j.verdict.reason) for j in full.rejected
    ]
    assert short.ranked_by == full.ranked_by


def test_a_failing_kind_is_judged_once_without_the_engines_own_checks():

    jetson_only = trt_engine(platform="aarch64")  # a kind that fails on an x86_64 machine, whatever its size
    small = machine(memory_mib=1024, shapes={"input": [1, 3]})
    big = replace(jetson_only, size=4096 * MIB)
    full = judge(big, small)
    assert not full.runs and {Rule.MEMORY, Rule.PLATFORM} <= {c.rule for c in full.checks}
    short = judge(big, small, full=False)
    assert (short.runs, short.rule, short.reason) == (full.runs, full.rule, full.reason)
    assert Rule.MEMORY not in {c.rule for c in short.checks}  # the engine's own checks are left out
    assert judge(jetson_only, small, full=False) is short  # one verdict for the kind, shared
    assert judge(big, small) == full  # a full judgement is still the engine's own
