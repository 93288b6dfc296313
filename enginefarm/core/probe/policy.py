"""What a probed machine serves: the targets it builds (and so the queues it consumes), those whose engines it
benchmarks, and what the catalog says while no worker can benchmark one."""

from __future__ import annotations

from enginefarm.core.domain import (
    ARCHES,
    BACKEND_MODULES,
    ORT_CUDA_PREFIX,
    RTX_PORTABLE_CCS,
    Backend,
    Target,
    arch_of_cc,
)
from enginefarm.core.probe.machineprobe import MachineProbe
from enginefarm.core.probe.modules import ORT_MODULE, RTX_MODULE, TRT_MODULE


def ort_cuda_targets(probe: MachineProbe) -> list[Target]:
    """``onnxruntime/cuda-smXY`` for each GPU's compute capability, where ONNX Runtime's CUDA provider loads."""
    if not (probe.modules.get(ORT_MODULE) and probe.ort_cuda):
        return []
    archs = {f"{ORT_CUDA_PREFIX}{arch_of_cc(g.compute_capability)}" for g in probe.gpus}
    return [Target(Backend.ONNXRUNTIME, a) for a in sorted(archs) if a in ARCHES[Backend.ONNXRUNTIME]]


def gpu_devices(probe: MachineProbe) -> list[tuple[str, str | None]]:
    """(label, compute capability) of every GPU, the Jetson's included unless NVML already lists it."""
    devices: list[tuple[str, str | None]] = [(f"GPU {g.index} {g.name}", g.compute_capability) for g in probe.gpus]
    j = probe.jetson
    if j and not any(g.compute_capability == j.compute_capability for g in probe.gpus):
        devices.append((f"Jetson {j.model}", j.compute_capability))
    return devices


def buildable_targets(probe: MachineProbe) -> list[Target]:
    """Return the sorted targets this machine can build."""
    targets = _runs_here(probe)
    # TensorRT-RTX compiles ahead of time without a GPU, but only ships x86_64 wheels.
    if probe.modules.get(RTX_MODULE) and probe.platform == "x86_64":
        targets.update(Target(Backend.TENSORRT_RTX, a) for a in ARCHES[Backend.TENSORRT_RTX])
    return sorted(targets)


def _runs_here(probe: MachineProbe) -> set[Target]:
    """The targets whose engines are built and run on this machine's own CPU and GPUs: ONNX Runtime's, and full
    TensorRT's, which builds only for the GPU it runs on and only when its module imports."""
    targets = set(ort_cuda_targets(probe))
    if probe.modules.get(ORT_MODULE) and f"cpu-{probe.platform}" in ARCHES[Backend.ONNXRUNTIME]:
        targets.add(Target(Backend.ONNXRUNTIME, f"cpu-{probe.platform}"))
    if probe.modules.get(TRT_MODULE):
        for _, cc in gpu_devices(probe):
            if cc and arch_of_cc(cc) in ARCHES[Backend.TENSORRT]:
                targets.add(Target(Backend.TENSORRT, arch_of_cc(cc)))
    return targets


def benchmark_targets(probe: MachineProbe) -> list[Target]:
    """The targets whose engines this machine can run, so benchmark: a GPU of compute capability 8.6 with
    tensorrt_rtx importable serves ``tensorrt-rtx/sm86`` (and ``tensorrt-rtx/portable``, which runs there);
    full TensorRT serves its GPU's architecture; ONNX Runtime serves the worker's CPU."""
    targets = _runs_here(probe)
    for _, cc in gpu_devices(probe) if probe.modules.get(RTX_MODULE) and probe.platform == "x86_64" else []:
        if cc and arch_of_cc(cc) in ARCHES[Backend.TENSORRT_RTX]:
            targets.add(Target(Backend.TENSORRT_RTX, arch_of_cc(cc)))
        if cc in RTX_PORTABLE_CCS:
            targets.add(Target(Backend.TENSORRT_RTX, "portable"))
    return sorted(targets)


def benchmark_pending_reason(target: Target) -> str:
    """What the catalog says about an engine no live worker can benchmark."""
    if target.is_ort_cuda:
        return (
            f"benchmark pending: no worker with a GPU of compute capability {target.compute_capability} "
            "and ONNX Runtime's CUDA execution provider"
        )
    if target.backend is Backend.ONNXRUNTIME:
        return f"benchmark pending: no worker with ONNX Runtime on a {target.arch.removeprefix('cpu-')} CPU"
    if target.arch == "portable":
        return (
            f"benchmark pending: no worker with a GPU of compute capability {'/'.join(RTX_PORTABLE_CCS)} "
            f"and {BACKEND_MODULES[target.backend]}"
        )
    return f"benchmark pending: no worker with an {target.arch} GPU and {BACKEND_MODULES[target.backend]}"
