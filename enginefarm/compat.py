"""Which engine runs on which machine: NVIDIA's compatibility rules, each with its reason.

``judge(engine, machine)`` answers one engine for one machine: whether it runs, how close a
match it is, and the exact rule that decided. A field the machine leaves unknown is not held
against an engine, but the verdict says it was not checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from enginefarm.domain import Backend, EngineDescriptor, HardwareCompat, Machine, cc_tuple

# CUDA major → lowest driver that runs it (CUDA minor-version compatibility).
DRIVER_FLOORS: dict[int, int] = {11: 450, 12: 525, 13: 580}

# Version-compatible engines also run on later runtimes across these major pairs (support matrix).
CROSS_MAJOR: frozenset[tuple[int, int]] = frozenset({(8, 9), (8, 10), (10, 11)})
# Version compatibility exists from TensorRT 8.6 on, for the builder and the runtime alike.
VERSION_COMPAT_FLOOR = (8, 6)


class Match(IntEnum):
    """How close a runnable engine fits; lower is better."""

    EXACT_GPU = 0  # built on this GPU model
    EXACT_CC = 1  # built for this compute capability
    COMPATIBLE = 2  # runs through hardware- or version-compatibility, or a portable engine
    CPU_FALLBACK = 3  # the ONNX Runtime artifact

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass
class Verdict:
    runs: bool
    match: Match | None
    reason: str
    unchecked: list[str] = field(default_factory=list)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _reject(reason: str) -> Verdict:
    return Verdict(False, None, reason)


def _check_trt_version(e: EngineDescriptor, m: Machine) -> tuple[str | None, bool]:
    """(rejection or None, whether the match relied on version compatibility)."""
    runtime = m.trt_version
    built = e.trt_version or e.backend_version
    if runtime is None:
        return None, False
    if runtime == built:
        if m.lean_runtime and not e.version_compatible:
            return f"you run only the lean runtime {runtime}, which loads only version-compatible engines", False
        return None, False
    if not e.version_compatible:
        return f"built with TensorRT {built}, you run {runtime}, not version-compatible", False
    got, want = _version(runtime), _version(built)
    if got[:2] < VERSION_COMPAT_FLOOR or want[:2] < VERSION_COMPAT_FLOOR:
        return f"built with TensorRT {built}, you run {runtime}; version compatibility needs 8.6 or newer on both sides", False
    if got < want:
        return f"built with TensorRT {built}, you run the older {runtime}; version-compatible engines never run on older runtimes", False
    if got[0] != want[0] and (want[0], got[0]) not in CROSS_MAJOR:
        return f"built with TensorRT {built}, you run {runtime}; version compatibility does not cross from {want[0]}.x to {got[0]}.x", False
    return None, True


def _check_cc_trt(e: EngineDescriptor, m: Machine) -> tuple[str | None, bool]:
    cc = m.compute_capability
    if cc is None or e.compute_capability is None:
        return None, False
    if e.hardware_compat == HardwareCompat.AMPERE_PLUS.value:
        if m.is_jetson:
            return "built Ampere+ hardware-compatible, which Jetson does not support", False
        if cc_tuple(cc) < (8, 0):
            return f"built Ampere+ hardware-compatible, which needs compute capability 8.0 or newer; you have {cc}", False
        return None, cc != e.compute_capability
    if cc != e.compute_capability:
        return f"built for compute capability {e.compute_capability}, you have {cc}, not hardware-compatible", False
    return None, False


def _check_rtx(e: EngineDescriptor, m: Machine) -> tuple[str | None, bool]:
    runtime = m.trt_rtx_version
    if runtime is not None and runtime != e.backend_version:
        return f"built with TensorRT-RTX {e.backend_version}, you run {runtime}; TensorRT-RTX engines do not load across releases", False
    cc = m.compute_capability
    if cc is None:
        return None, False
    if e.compute_capability is None:  # portable engine
        if cc not in e.compute_capabilities:
            return f"portable TensorRT-RTX engine runs on {', '.join(e.compute_capabilities)}, you have {cc}", False
        return None, True
    if cc != e.compute_capability:
        return f"TensorRT-RTX engine built for compute capability {e.compute_capability}, you have {cc}", False
    return None, False


def _check_driver(e: EngineDescriptor, m: Machine) -> str | None:
    if not e.cuda_version or not m.driver_version:
        return None
    floor = DRIVER_FLOORS.get(_version(e.cuda_version)[0])
    if floor and _version(m.driver_version)[0] < floor:
        return f"built with CUDA {e.cuda_version}, which needs driver {floor} or newer; you have {m.driver_version}"
    return None


def judge(e: EngineDescriptor, m: Machine) -> Verdict:
    """Whether engine ``e`` runs on machine ``m``, how well it matches, and why."""
    unchecked = [name for name, value in (("platform", m.platform), ("compute capability", m.compute_capability)) if value is None]
    if m.platform and e.platform != m.platform:
        return _reject(f"built for {e.platform}, you run {m.platform}")
    if e.backend == Backend.ONNXRUNTIME.value:
        return Verdict(True, Match.CPU_FALLBACK, f"ONNX Runtime CPU artifact for {e.platform}", unchecked)
    if e.backend == Backend.TENSORRT_RTX.value:
        problem, relaxed = _check_rtx(e, m)
        if m.trt_rtx_version is None:
            unchecked.append("TensorRT-RTX version")
    else:
        problem, relaxed = _check_trt_version(e, m)
        if problem is None:
            problem, relaxed_cc = _check_cc_trt(e, m)
            relaxed = relaxed or relaxed_cc
        if m.trt_version is None:
            unchecked.append("TensorRT version")
    problem = problem or _check_driver(e, m)
    if problem is None and m.memory_mib and e.size > m.memory_mib << 20:
        problem = f"engine needs at least {e.size >> 20} MiB, your GPU has {m.memory_mib} MiB"
    if problem:
        return _reject(problem)
    if relaxed:
        return Verdict(True, Match.COMPATIBLE, _compatible_reason(e, m), unchecked)
    if e.gpu_name and m.gpu_name and e.gpu_name == m.gpu_name:
        return Verdict(True, Match.EXACT_GPU, f"built on your GPU model, {e.gpu_name}", unchecked)
    if e.compute_capability is None:
        return Verdict(True, Match.COMPATIBLE, _compatible_reason(e, m), unchecked)
    return Verdict(True, Match.EXACT_CC, f"built for your compute capability {e.compute_capability}", unchecked)


def _compatible_reason(e: EngineDescriptor, m: Machine) -> str:
    if e.backend == Backend.TENSORRT_RTX.value:
        return f"portable TensorRT-RTX engine; runs on {', '.join(e.compute_capabilities)}"
    parts = []
    if e.hardware_compat == HardwareCompat.AMPERE_PLUS.value and e.compute_capability != m.compute_capability:
        parts.append(f"Ampere+ hardware-compatible engine built on {e.compute_capability}")
    if e.version_compatible and m.trt_version and m.trt_version != (e.trt_version or e.backend_version):
        parts.append(f"version-compatible engine built with TensorRT {e.trt_version or e.backend_version}")
    return "; ".join(parts) or "compatible"
