"""The rules for an ONNX Runtime CUDA artifact (target ``onnxruntime/cuda-smXY``): a prepared graph, not GPU code,
so it runs on any GPU the CUDA build of ONNX Runtime supports, on an ONNX Runtime as new as the one that prepared it.
Called by ``enginefarm.core.compat.judge``, whose verdict they make."""

from __future__ import annotations

from enginefarm.core.domain import ORT_CUDA_PREFIX, Backend, EngineDescriptor, cc_tuple
from enginefarm.core.machine import Machine
from enginefarm.core.verdicts import (
    NO_CC,
    Check,
    Rule,
    check_fail,
    check_ok,
    check_relaxed,
    check_unchecked,
    version_tuple,
)

# The lowest compute capability ONNX Runtime's CUDA execution provider runs on, per CUDA major of its build
# (CUDA 13 dropped Maxwell, Pascal and Volta; onnxruntime-gpu's CUDA 12 wheels start at 6.0).
ORT_CUDA_MIN_CC: dict[int, tuple[int, int]] = {12: (6, 0), 13: (7, 5)}


def is_ort_cuda(e: EngineDescriptor) -> bool:
    """An ONNX Runtime artifact for its CUDA execution provider (target ``onnxruntime/cuda-smXY``)."""
    return e.backend == Backend.ONNXRUNTIME.value and e.target.partition("/")[2].startswith(ORT_CUDA_PREFIX)


def check_ort_cuda(e: EngineDescriptor, m: Machine) -> Check:
    """An ONNX Runtime CUDA artifact is a prepared graph, not GPU code: it runs on any GPU that the CUDA build of
    ONNX Runtime supports. Its own compute capability is a match; another supported one runs, relaxed."""
    cc, built = m.compute_capability, e.compute_capability
    if not m.ort_cuda:
        said = (
            f"you run ONNX Runtime {m.ort_version} without CUDA"
            if m.ort_version
            else "you did not say you run ONNX Runtime with CUDA (ort_cuda)"
        )
        return check_fail(Rule.ORT_CUDA, f"prepared for ONNX Runtime's CUDA execution provider; {said}")
    if cc is None:
        return check_fail(Rule.COMPUTE_CAPABILITY, f"prepared on compute capability {built}; {NO_CC}")
    if cc == built:
        return check_ok(Rule.COMPUTE_CAPABILITY, f"prepared and measured on your compute capability {cc}")
    major = version_tuple(e.cuda_version or "")[:1]
    floor = ORT_CUDA_MIN_CC.get(major[0]) if major else None
    if floor and cc_tuple(cc) < floor:
        return check_fail(
            Rule.COMPUTE_CAPABILITY,
            f"ONNX Runtime built for CUDA {e.cuda_version} runs on compute "
            f"capability {floor[0]}.{floor[1]} or newer; you have {cc}",
        )
    return check_relaxed(
        Rule.ORT_CUDA,
        f"a graph for ONNX Runtime CUDA prepared on {built} runs on your {cc} "
        "(no GPU code in it; its figures were measured on another GPU)",
    )


def check_ort_version(e: EngineDescriptor, m: Machine) -> Check:
    """A graph saved by ONNX Runtime after its optimizations may hold its contrib operators, which a later
    release still runs and an earlier one may not."""
    if not m.ort_version:
        return check_unchecked(
            Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}; your ONNX Runtime version is unknown"
        )
    got, want = version_tuple(m.ort_version), version_tuple(e.backend_version)
    if got[:2] == want[:2]:
        return check_ok(Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}, you run {m.ort_version}")
    if got < want:
        return check_fail(
            Rule.ORT_VERSION,
            f"prepared by ONNX Runtime {e.backend_version}, you run the older "
            f"{m.ort_version}, which may lack its fused operators",
        )
    return check_relaxed(
        Rule.ORT_VERSION, f"prepared by ONNX Runtime {e.backend_version}, runs on your later {m.ort_version}"
    )
