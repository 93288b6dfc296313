"""``compat.judge``: NVIDIA's engine compatibility rules, one table row per rule.

Each row's id names the rule it checks. Rows build an engine descriptor and a machine from a
realistic baseline (a TensorRT 10.13 engine built on an RTX 3090 for CUDA 12.9, and an RTX A6000
machine with the same TensorRT) and change only what the rule is about.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from enginefarm.compat import CROSS_MAJOR, DRIVER_FLOORS, Match, judge
from enginefarm.domain import RTX_PORTABLE_CCS, EngineDescriptor, Machine

TRT = "10.13.3.9"
RTX = "1.7.1.116"
MIB = 1 << 20


def trt_engine(**kw) -> EngineDescriptor:
    base = EngineDescriptor(
        target="tensorrt/sm86", backend="tensorrt", backend_version=TRT, precision="fp16", platform="x86_64",
        compute_capability="8.6", compute_capabilities=["8.6"], gpu_name="NVIDIA GeForce RTX 3090", trt_version=TRT,
        cuda_version="12.9", driver_version="575.57.08", size=50 * MIB, sha256="a" * 64)
    return replace(base, **kw)


def rtx_engine(arch: str = "sm86", **kw) -> EngineDescriptor:
    portable = arch == "portable"
    cc = None if portable else f"{arch[2:-1]}.{arch[-1]}"
    base = EngineDescriptor(
        target=f"tensorrt-rtx/{arch}", backend="tensorrt-rtx", backend_version=RTX, precision="fp32",
        platform="x86_64", compute_capability=cc, compute_capabilities=list(RTX_PORTABLE_CCS) if portable else [cc],
        trt_version=RTX, cuda_version="13.0", size=20 * MIB, sha256="b" * 64)
    return replace(base, **kw)


def ort_engine(**kw) -> EngineDescriptor:
    base = EngineDescriptor(target="onnxruntime/cpu-x86_64", backend="onnxruntime", backend_version="1.23.2",
                            precision="fp32", platform="x86_64", size=5 * MIB, sha256="c" * 64)
    return replace(base, **kw)


def machine(**kw) -> Machine:
    base = Machine(gpu_name="NVIDIA RTX A6000", compute_capability="8.6", memory_mib=49140, driver_version="575.57.08",
                   cuda_version="12.9", trt_version=TRT, platform="x86_64", os="Linux 6.8 (Ubuntu 24.04.1 LTS)")
    return replace(base, **kw)


def rtx_machine(**kw) -> Machine:
    base = Machine(gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9", memory_mib=24564,
                   driver_version="580.82.07", cuda_version="13.0", trt_rtx_version=RTX, platform="x86_64")
    return replace(base, **kw)


def jetson(**kw) -> Machine:
    base = Machine(gpu_name="Orin", compute_capability="8.7", memory_mib=62841, driver_version="540.4.0",
                   cuda_version="12.6", trt_version=TRT, platform="aarch64", jetpack="6.2")
    return replace(base, **kw)


OK, NO = True, False
E, C, CPU, G = Match.EXACT_CC, Match.COMPATIBLE, Match.CPU_FALLBACK, Match.EXACT_GPU

CASES = [
    # --- TensorRT version rules
    pytest.param(trt_engine(), machine(), OK, E, "built for your compute capability 8.6",
                 id="trt-version: exact TensorRT version runs"),
    pytest.param(trt_engine(), machine(trt_version="10.12.0.36"), NO, None, "not version-compatible",
                 id="trt-version: older runtime, plain engine, rejected"),
    pytest.param(trt_engine(version_compatible=True), machine(trt_version="10.12.0.36"), NO, None,
                 "version-compatible engines never run on older runtimes",
                 id="trt-version: older runtime rejected even with version-compat"),
    pytest.param(trt_engine(), machine(trt_version="10.14.1.48"), NO, None,
                 f"built with TensorRT {TRT}, you run 10.14.1.48, not version-compatible",
                 id="trt-version: newer runtime without version-compat rejected"),
    pytest.param(trt_engine(), machine(trt_version="10.13.3.10"), NO, None, "not version-compatible",
                 id="trt-version: a different patch build is a different version"),
    pytest.param(trt_engine(version_compatible=True), machine(trt_version="10.14.1.48"), OK, C,
                 f"version-compatible engine built with TensorRT {TRT}",
                 id="trt-version: newer same-major runtime with version-compat is compatible"),
    pytest.param(trt_engine(version_compatible=True, trt_version="8.6.1.6", backend_version="8.6.1.6"),
                 machine(trt_version="10.3.0.26"), OK, C, "built with TensorRT 8.6.1.6",
                 id="trt-version: cross-major 8 to 10 with version-compat"),
    pytest.param(trt_engine(version_compatible=True, trt_version="8.6.1.6", backend_version="8.6.1.6"),
                 machine(trt_version="9.2.0.5"), OK, C, "built with TensorRT 8.6.1.6",
                 id="trt-version: cross-major 8 to 9 with version-compat"),
    pytest.param(trt_engine(version_compatible=True, trt_version="8.5.3.1", backend_version="8.5.3.1"),
                 machine(trt_version="8.6.1.6"), NO, None, "needs 8.6 or newer on both sides",
                 id="trt-version: version-compat needs 8.6+ builder"),
    pytest.param(trt_engine(version_compatible=True), machine(trt_version="11.0.0.114"), OK, C,
                 "version-compatible engine",
                 id="trt-version: cross-major 10 to 11 with version-compat"),
    pytest.param(trt_engine(version_compatible=True), machine(trt_version="12.0.0.1"), NO, None,
                 "version compatibility does not cross from 10.x to 12.x",
                 id="trt-version: cross-major 10 to 12 rejected"),
    pytest.param(trt_engine(), machine(trt_version="11.0.0.114"), NO, None, "not version-compatible",
                 id="trt-version: cross-major 10 to 11 without version-compat rejected"),
    pytest.param(trt_engine(version_compatible=True, trt_version="11.0.0.114", backend_version="11.0.0.114"),
                 machine(), NO, None, "older",
                 id="trt-version: 11 engine on a 10 runtime rejected"),
    # --- lean runtime
    pytest.param(trt_engine(), machine(lean_runtime=True), NO, None, "lean runtime",
                 id="lean-runtime: plain engine rejected even at the same version"),
    pytest.param(trt_engine(version_compatible=True), machine(lean_runtime=True), OK, E, "compute capability 8.6",
                 id="lean-runtime: version-compatible engine at the same version runs"),
    pytest.param(trt_engine(version_compatible=True), machine(lean_runtime=True, trt_version="10.14.1.48"), OK, C,
                 "version-compatible engine",
                 id="lean-runtime: version-compatible engine on a newer lean runtime runs"),
    # --- compute capability and hardware compatibility
    pytest.param(trt_engine(), machine(compute_capability="8.9", gpu_name="NVIDIA L40S"), NO, None,
                 "built for compute capability 8.6, you have 8.9, not hardware-compatible",
                 id="cc: mismatch without hardware-compat rejected"),
    pytest.param(trt_engine(hardware_compat="ampere_plus"), machine(compute_capability="8.9", gpu_name="NVIDIA L40S"),
                 OK, C, "Ampere+ hardware-compatible engine built on 8.6",
                 id="hw-compat: ampere_plus sm86 engine on sm89 discrete GPU"),
    pytest.param(trt_engine(hardware_compat="ampere_plus"), machine(compute_capability="9.0", gpu_name="NVIDIA H100"),
                 OK, C, "Ampere+",
                 id="hw-compat: ampere_plus sm86 engine on sm90"),
    pytest.param(trt_engine(hardware_compat="ampere_plus"), machine(compute_capability="7.5", gpu_name="Tesla T4"),
                 NO, None, "needs compute capability 8.0 or newer; you have 7.5",
                 id="hw-compat: ampere_plus on sm75 rejected"),
    pytest.param(trt_engine(hardware_compat="ampere_plus", platform="aarch64", compute_capability="8.0",
                            compute_capabilities=["8.0"]), jetson(), NO, None, "Jetson does not support",
                 id="hw-compat: ampere_plus on Jetson (jetpack set) rejected"),
    pytest.param(trt_engine(hardware_compat="ampere_plus"), machine(gpu_name="NVIDIA RTX A6000"), OK, E,
                 "built for your compute capability 8.6",
                 id="hw-compat: ampere_plus on its own cc is an exact-cc match"),
    pytest.param(trt_engine(hardware_compat="same_compute_capability"), machine(compute_capability="8.9"), NO, None,
                 "not hardware-compatible",
                 id="hw-compat: same_compute_capability does not cross cc"),
    pytest.param(trt_engine(platform="aarch64", compute_capability="8.7", compute_capabilities=["8.7"],
                            gpu_name="Orin", cuda_version="12.6"), jetson(), OK, G, "built on your GPU model, Orin",
                 id="cc: Jetson engine on the same Jetson module"),
    pytest.param(trt_engine(hardware_compat="ampere_plus", version_compatible=True),
                 machine(compute_capability="8.9", trt_version="10.14.1.48"), OK, C,
                 "Ampere+ hardware-compatible engine built on 8.6; version-compatible engine",
                 id="hw-compat+trt-version: both relaxations named"),
    # --- platform
    pytest.param(trt_engine(), machine(platform="aarch64"), NO, None, "built for x86_64, you run aarch64",
                 id="platform: x86_64 engine on aarch64 rejected"),
    pytest.param(trt_engine(platform="aarch64"), machine(), NO, None, "built for aarch64, you run x86_64",
                 id="platform: aarch64 engine on x86_64 rejected"),
    # --- driver floors (CUDA minor-version compatibility)
    pytest.param(trt_engine(), machine(driver_version="525.60.13"), OK, E, "compute capability",
                 id="driver: CUDA 12 on driver 525 runs"),
    pytest.param(trt_engine(), machine(driver_version="520.61.05"), NO, None,
                 "built with CUDA 12.9, which needs driver 525 or newer; you have 520.61.05",
                 id="driver: CUDA 12 on driver 520 rejected"),
    pytest.param(trt_engine(cuda_version="13.0"), machine(driver_version="580.65.06"), OK, E, "compute capability",
                 id="driver: CUDA 13 on driver 580 runs"),
    pytest.param(trt_engine(cuda_version="13.0"), machine(driver_version="575.57.08"), NO, None,
                 "needs driver 580 or newer",
                 id="driver: CUDA 13 on driver 575 rejected"),
    pytest.param(rtx_engine("sm89"), rtx_machine(driver_version="570.172.08"), NO, None, "needs driver 580 or newer",
                 id="driver: TensorRT-RTX CUDA 13 engine on driver 570 rejected"),
    # --- TensorRT-RTX
    pytest.param(rtx_engine("sm89"), rtx_machine(), OK, E, "built for your compute capability 8.9",
                 id="rtx: same release and cc runs"),
    pytest.param(rtx_engine("sm89"), rtx_machine(trt_rtx_version="1.6.0.45"), NO, None,
                 "TensorRT-RTX engines do not load across releases",
                 id="rtx: different release rejected"),
    pytest.param(rtx_engine("sm86"), rtx_machine(), NO, None,
                 "TensorRT-RTX engine built for compute capability 8.6, you have 8.9",
                 id="rtx: cc mismatch rejected"),
    pytest.param(rtx_engine("portable"), rtx_machine(), OK, C, "portable TensorRT-RTX engine",
                 id="rtx: portable engine on 8.9 is compatible"),
    pytest.param(rtx_engine("portable"), rtx_machine(compute_capability="7.5", gpu_name="NVIDIA GeForce RTX 2080 Ti"),
                 NO, None, "you have 7.5",
                 id="rtx: portable engine on 7.5 (Turing) rejected"),
    pytest.param(rtx_engine("portable"), rtx_machine(compute_capability="9.0", gpu_name="NVIDIA H100"), NO, None,
                 "portable TensorRT-RTX engine runs on 8.0, 8.6, 8.9, 12.0, 12.1, you have 9.0",
                 id="rtx: portable engine on 9.0 rejected"),
    pytest.param(rtx_engine("sm75"), rtx_machine(compute_capability="7.5"), OK, E, "compute capability 7.5",
                 id="rtx: explicit sm75 engine on Turing runs"),
    # --- memory
    pytest.param(trt_engine(size=6 << 30), machine(memory_mib=4096), NO, None,
                 "engine needs at least 6144 MiB, your GPU has 4096 MiB",
                 id="memory: engine larger than the GPU rejected"),
    pytest.param(trt_engine(size=3 << 30), machine(memory_mib=4096), OK, E, "compute capability",
                 id="memory: engine that fits runs"),
    # --- ONNX Runtime
    pytest.param(ort_engine(), machine(), OK, CPU, "ONNX Runtime CPU artifact for x86_64",
                 id="onnxruntime: CPU artifact is the fallback on a GPU machine"),
    pytest.param(ort_engine(), Machine(platform="x86_64"), OK, CPU, "ONNX Runtime",
                 id="onnxruntime: CPU artifact on a machine without GPU"),
    pytest.param(ort_engine(), machine(platform="aarch64"), NO, None, "built for x86_64, you run aarch64",
                 id="onnxruntime: platform still applies"),
    # --- match quality
    pytest.param(trt_engine(), machine(gpu_name="NVIDIA GeForce RTX 3090"), OK, G,
                 "built on your GPU model, NVIDIA GeForce RTX 3090",
                 id="match: same GPU model is EXACT_GPU"),
    pytest.param(trt_engine(), machine(gpu_name="NVIDIA GeForce RTX 3080"), OK, E,
                 "built for your compute capability 8.6",
                 id="match: other GPU model of the same cc is EXACT_CC"),
]


@pytest.mark.parametrize("engine, mach, runs, match, words", CASES)
def test_judge(engine, mach, runs, match, words):
    v = judge(engine, mach)
    assert v.runs is runs, v.reason
    assert v.match == match
    assert words in v.reason
    if not runs:
        assert v.unchecked == []  # a rejection names the rule, not the gaps


def test_table_is_big_enough():
    assert len(CASES) >= 25


def test_unknown_machine_fields_are_listed_as_unchecked():
    v = judge(trt_engine(), Machine())
    assert v.runs and v.match is Match.EXACT_CC
    assert v.unchecked == ["platform", "compute capability", "TensorRT version"]
    v = judge(rtx_engine("sm89"), Machine(platform="x86_64", compute_capability="8.9"))
    assert v.runs and v.unchecked == ["TensorRT-RTX version"]


def test_match_order_and_labels():
    assert Match.EXACT_GPU < Match.EXACT_CC < Match.COMPATIBLE < Match.CPU_FALLBACK
    assert [m.label for m in Match] == ["exact_gpu", "exact_cc", "compatible", "cpu_fallback"]


def test_rule_tables():
    assert DRIVER_FLOORS[12] == 525 and DRIVER_FLOORS[13] == 580
    assert (8, 10) in CROSS_MAJOR and (10, 11) in CROSS_MAJOR and (10, 12) not in CROSS_MAJOR


def test_best_engine_for_a_machine_sorts_by_match():
    engines = [ort_engine(), trt_engine(hardware_compat="ampere_plus", gpu_name="NVIDIA A100", compute_capability="8.0"),
               trt_engine(compute_capability="8.9", gpu_name="NVIDIA L40S"), trt_engine(gpu_name="NVIDIA RTX A6000")]
    verdicts = [(judge(e, machine()), e) for e in engines]
    runnable = sorted((v.match, e.gpu_name or "cpu") for v, e in verdicts if v.runs)
    assert runnable == [(G, "NVIDIA RTX A6000"), (C, "NVIDIA A100"), (CPU, "cpu")]
