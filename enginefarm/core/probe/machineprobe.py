"""This machine, probed: ``MachineProbe`` (GPUs, Jetson, OS, CPU, importable backends, ONNX Runtime's CUDA
provider), and the same machine as a deploy-time ``Machine`` fingerprint (``machine_fingerprint``,
``this_machine``)."""

from __future__ import annotations

import platform as _platform
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from enginefarm.core.machine import Machine
from enginefarm.core.ortcuda import probe_ort_cuda
from enginefarm.core.probe.gpus import GpuInfo, probe_any_gpus
from enginefarm.core.probe.jetson import JetsonInfo, probe_jetson, read_file
from enginefarm.core.probe.modules import LEAN_MODULE, ORT_MODULE, RTX_MODULE, TRT_MODULE, import_version, probe_modules

_PLATFORMS = {"amd64": "x86_64", "x64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


@dataclass
class MachineProbe:
    hostname: str
    platform: str
    os: str
    gpus: list[GpuInfo]
    driver_version: str | None
    cuda_version: str | None
    jetson: JetsonInfo | None
    modules: dict[str, str | None]
    module_errors: dict[str, str] = field(default_factory=dict)
    nvml_error: str | None = None
    gpu_source: str | None = None  # "nvml", or "nvidia-smi" where NVML could not be used
    cpu_name: str | None = None  # the CPU model, which CPU benchmarks are compared by
    # ONNX Runtime's CUDA execution provider: the CUDA version its build targets when it loads here, else why not.
    ort_cuda: str | None = None
    ort_cuda_error: str | None = None
    cudnn_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The probe as JSON-ready plain data."""
        return asdict(self)


def _os_name(root: Path) -> str:
    release = _platform.release().split("-")[0]
    kernel = f"{_platform.system()} {'.'.join(release.split('.')[:2])}".strip()
    for rel in ("etc/os-release", "usr/lib/os-release"):
        for line in (read_file(root / rel) or "").splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{kernel} ({line.split('=', 1)[1].strip().strip(chr(34)).strip(chr(39))})"
    return kernel


def normalize_platform(machine: str) -> str:
    """``amd64`` → ``x86_64``, ``arm64`` → ``aarch64``; anything else lower-cased as is."""
    return _PLATFORMS.get(machine.lower(), machine.lower())


def probe_machine(root: Path = Path("/")) -> MachineProbe:
    """Probe this machine; ``root`` is where /etc and /proc are read from (tests pass a recorded tree)."""
    gpus, driver, cuda, nvml_error, source = probe_any_gpus()
    modules, module_errors = probe_modules()
    return MachineProbe(
        hostname=socket.gethostname(),
        platform=normalize_platform(_platform.machine()),
        os=_os_name(root),
        gpus=gpus,
        driver_version=driver,
        cuda_version=cuda,
        jetson=probe_jetson(root),
        modules=modules,
        module_errors=module_errors,
        nvml_error=nvml_error,
        gpu_source=source,
        cpu_name=cpu_name(root),
        **_ort_cuda_fields(gpus, modules),
    )


def cpu_name(root: Path | str = "/") -> str | None:
    """The CPU model as /proc/cpuinfo names it (x86 ``model name``; Arm ``Hardware`` or ``CPU part``), else what
    the platform module says; None when nothing names it."""
    try:
        text = (Path(root) / "proc" / "cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Hardware", "Model"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return " ".join(value.split())[:200]
    return _platform.processor() or None


def _ort_cuda_fields(gpus: list[GpuInfo], modules: dict[str, str | None]) -> dict[str, str | None]:
    if not modules.get(ORT_MODULE):
        return {}
    if not gpus:
        return {"ort_cuda_error": "no NVIDIA GPU"}
    cuda, cudnn, error = probe_ort_cuda()
    return {"ort_cuda": cuda, "cudnn_version": cudnn, "ort_cuda_error": error}


def machine_fingerprint(probe: MachineProbe, gpu_index: int = 0) -> Machine:
    """Return this machine as a deploy-time ``Machine``: GPU ``gpu_index`` (or the Jetson) plus runtimes."""
    gpu = next((g for g in probe.gpus if g.index == gpu_index), None)
    if probe.gpus and gpu is None:
        raise ValueError(f"no GPU {gpu_index}; this machine has {', '.join(str(g.index) for g in probe.gpus)}")
    j = probe.jetson
    name: str | None
    cc: str | None
    memory: int | None
    if gpu:
        name, cc, memory = gpu.name, gpu.compute_capability, gpu.memory_mib or None
    elif j:
        name, cc, memory = j.model, j.compute_capability, j.memory_mib
    else:
        name = cc = memory = None
    return Machine.detected(
        gpu_name=name,
        compute_capability=cc,
        memory_mib=memory,
        driver_version=probe.driver_version,
        cuda_version=probe.cuda_version,
        trt_version=probe.modules.get(TRT_MODULE),
        trt_rtx_version=probe.modules.get(RTX_MODULE),
        lean_runtime=import_version(LEAN_MODULE)[0] is not None,
        ort_version=probe.modules.get(ORT_MODULE),
        ort_cuda=bool(probe.ort_cuda and gpu),
        platform=probe.platform,
        os=probe.os,
        jetpack=j.jetpack if j else None,
        cpu_name=probe.cpu_name,
    )


GPU_RUNTIME_FIELDS = frozenset({"trt_version", "trt_rtx_version"})  # naming one describes them whole


def this_machine(**overrides: Any) -> Machine:
    """This machine as a deploy-time fingerprint, with any field given a non-None override replaced.

    Without a GPU the platform, OS and importable runtimes still count (a CPU-only deploy machine). Naming a GPU
    runtime (``trt_version``, ``trt_rtx_version``) describes the machine's GPU runtimes whole: the
    ones not named are not taken from this machine, so a workstation with TensorRT-RTX that describes a TensorRT
    server is not handed TensorRT-RTX engines.
    """
    probe = probe_machine()
    try:
        machine = machine_fingerprint(probe)
    except ValueError:
        machine = Machine.detected(
            platform=probe.platform,
            os=probe.os,
            trt_version=probe.modules.get(TRT_MODULE),
            trt_rtx_version=probe.modules.get(RTX_MODULE),
            ort_version=probe.modules.get(ORT_MODULE),
        )
    given = {key: value for key, value in overrides.items() if value is not None}
    if given.keys() & GPU_RUNTIME_FIELDS:
        given = {"trt_version": None, "trt_rtx_version": None, "lean_runtime": False, **given}  # lean: of trt
    # Through the constructor again: an override is checked by the same rules as a request's field.
    return replace(machine, **given)
