"""The probe in words: what was found and why each backend is or is not served; ``python -m enginefarm.core.probe``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from enginefarm.core.domain import ARCHES, Backend, arch_of_cc
from enginefarm.core.probe.machineprobe import MachineProbe, probe_machine
from enginefarm.core.probe.modules import ORT_MODULE, RTX_MODULE, TRT_MODULE
from enginefarm.core.probe.policy import buildable_targets, gpu_devices, ort_cuda_targets


def probe_report(probe: MachineProbe) -> list[str]:
    """Return human-readable lines: what was found and why each backend is or is not served."""
    lines = [f"host {probe.hostname}: {probe.platform}, {probe.os}"]
    for g in probe.gpus:
        lines.append(f"GPU {g.index}: {g.name}, compute capability {g.compute_capability}, {g.memory_mib} MiB")
    if probe.gpus or probe.driver_version:
        lines.append(f"driver {probe.driver_version or 'unknown'}, CUDA {probe.cuda_version or 'unknown'}")
    if probe.gpu_source == "nvidia-smi":
        lines.append(f"GPUs read with nvidia-smi (NVML: {probe.nvml_error or 'no GPU'})")
    elif probe.nvml_error:
        lines.append(
            f"NVML: {probe.nvml_error}" if probe.gpus else f"no GPU found via NVML or nvidia-smi: {probe.nvml_error}"
        )
    if j := probe.jetson:
        jp = f"JetPack {j.jetpack}" if j.jetpack else "JetPack unknown"
        lines.append(
            f"Jetson: {j.model}, L4T {j.l4t_release or 'unknown'} ({jp}), "
            f"compute capability {j.compute_capability or 'unknown'}"
        )

    def missing(backend: Backend, module: str) -> str:
        return f"{backend.value}: not importable ({probe.module_errors.get(module, 'no version')})"

    # tensorrt: one line per device, since each GPU decides its own target.
    trt = probe.modules.get(TRT_MODULE)
    devices = gpu_devices(probe)
    if not devices:
        why = f"no GPU ({probe.nvml_error})" if probe.nvml_error else "no GPU"
        lines.append(
            (missing(Backend.TENSORRT, TRT_MODULE) if not trt else f"tensorrt {trt}: {why}")
            + ": no tensorrt target served"
        )
    for label, cc in devices:
        arch = arch_of_cc(cc) if cc else None
        if arch not in ARCHES[Backend.TENSORRT]:
            lines.append(
                f"tensorrt: {label} has compute capability {cc or 'unknown'}"
                f"{f' ({arch})' if arch else ''}, which tensorrt does not build for: no target"
            )
        elif not trt:
            lines.append(f"{missing(Backend.TENSORRT, TRT_MODULE)}: tensorrt/{arch} not served ({label})")
        else:
            lines.append(f"tensorrt {trt}: serves tensorrt/{arch} ({label})")

    rtx = probe.modules.get(RTX_MODULE)
    if not rtx:
        lines.append(f"{missing(Backend.TENSORRT_RTX, RTX_MODULE)}: no tensorrt-rtx target served")
    elif probe.platform != "x86_64":
        lines.append(
            f"tensorrt-rtx {rtx}: importable, but TensorRT-RTX builds only on x86_64, not {probe.platform}: not served"
        )
    else:
        lines.append(
            f"tensorrt-rtx {rtx}: serves tensorrt-rtx/{{{','.join(ARCHES[Backend.TENSORRT_RTX])}}} "
            "(ahead of time, no GPU needed)"
        )

    ort = probe.modules.get(ORT_MODULE)
    arch = f"cpu-{probe.platform}"
    if not ort:
        lines.append(f"{missing(Backend.ONNXRUNTIME, ORT_MODULE)}: onnxruntime/{arch} not served")
    elif arch not in ARCHES[Backend.ONNXRUNTIME]:
        lines.append(f"onnxruntime {ort}: platform {probe.platform} is not one onnxruntime targets: not served")
    else:
        lines.append(f"onnxruntime {ort}: serves onnxruntime/{arch}")
    if ort and (probe.ort_cuda or probe.ort_cuda_error):
        served = ", ".join(map(str, ort_cuda_targets(probe)))
        if probe.ort_cuda and served:
            lines.append(
                f"onnxruntime {ort} CUDA (built for CUDA {probe.ort_cuda}, cuDNN "
                f"{probe.cudnn_version or 'not found'}): serves {served}"
            )
        elif probe.ort_cuda:
            lines.append(f"onnxruntime {ort} CUDA: no GPU of a compute capability it has a target for: not served")
        else:
            lines.append(f"onnxruntime {ort} CUDA: {probe.ort_cuda_error}: no onnxruntime/cuda target served")

    targets = buildable_targets(probe)
    lines.append(f"buildable targets: {', '.join(map(str, targets)) if targets else 'none'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the probe as JSON, then the report (which ends with the buildable targets)."""
    parser = argparse.ArgumentParser(prog="python -m enginefarm.core.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/"), help="read /etc and /proc under this directory")
    args = parser.parse_args(argv)
    probe = probe_machine(args.root)
    print(json.dumps(probe.to_dict(), indent=2))
    for line in probe_report(probe):
        print(line)
    return 0
