"""What this worker machine can build: GPUs, driver, Jetson board and importable backend modules.

``probe_machine()`` gathers the facts, ``buildable_targets()`` turns them into the targets (and so
the Celery queues) this worker serves, ``probe_report()`` explains the decision in words and
``machine_fingerprint()`` gives the same machine as a deploy-time ``Machine``.

Nothing here needs a GPU: without NVML, or with a backend whose native libraries fail to load,
the probe records why and carries on. pynvml and the backend modules are imported lazily.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import io
import json
import platform as _platform
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from enginefarm.domain import ARCHES, BACKEND_MODULES, ORT_CUDA_PREFIX, RTX_PORTABLE_CCS, Backend, Target, arch_of_cc
from enginefarm.machine import Machine
from enginefarm.nvml import NvmlUnavailable, nvml_session
from enginefarm.ortcuda import ORT_CUDA_PROVIDER, probe_ort_cuda

TRT_MODULE = BACKEND_MODULES[Backend.TENSORRT]
RTX_MODULE = BACKEND_MODULES[Backend.TENSORRT_RTX]
ORT_MODULE = BACKEND_MODULES[Backend.ONNXRUNTIME]
LEAN_MODULE = "tensorrt_lean"  # the lean runtime only runs engines, so it is not a backend

# Jetson SoC (device-tree "nvidia,tegraNNN") -> GPU compute capability.
TEGRA_CCS: dict[str, str] = {
    "tegra210": "5.3",  # Nano, TX1
    "tegra186": "6.2",  # TX2
    "tegra194": "7.2",  # Xavier
    "tegra234": "8.7",  # Orin
    "tegra264": "11.0",  # Thor (sm_101 until CUDA 13 renamed it sm_110)
}

# L4T release -> JetPack, matched on the longest leading run of version components, so a point
# release missing from the table still maps to its line (R36.4.7 -> 6.2, R35.9 -> 5.1).
L4T_JETPACK: dict[tuple[int, ...], str] = {
    (35,): "5.1",
    (35, 3, 1): "5.1.1",
    (35, 4, 1): "5.1.2",
    (35, 5, 0): "5.1.3",
    (35, 6, 0): "5.1.4",
    (36, 3): "6.0",
    (36, 4): "6.2",
    (36, 4, 0): "6.1",
    (36, 4, 3): "6.2",
    (36, 4, 4): "6.2.1",
    (38,): "7.0",
    (38, 2): "7.0",
}

_PLATFORMS = {"amd64": "x86_64", "x64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


@dataclass
class GpuInfo:
    index: int
    name: str
    compute_capability: str
    memory_mib: int  # 0 where NVML cannot say (unified-memory boards)
    uuid: str | None = None


@dataclass
class JetsonInfo:
    model: str
    l4t_release: str  # "36.4.3"; "" when the board has no /etc/nv_tegra_release
    jetpack: str | None
    compute_capability: str | None  # None for a SoC missing from TEGRA_CCS
    memory_mib: int | None = None  # system memory, which the Jetson GPU shares


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


# --------------------------------------------------------------------------- GPUs via NVML


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _error(exc: BaseException) -> str:
    # ImportError text already names the module; for anything else the type is the useful part.
    if isinstance(exc, ImportError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def probe_gpus() -> tuple[list[GpuInfo], str | None, str | None, str | None]:
    """Return (gpus, driver_version, cuda_version, nvml_error); nvml_error is None when all went well."""
    gpus: list[GpuInfo] = []
    driver = cuda = None
    errors: list[str] = []
    try:
        with nvml_session() as pynvml:
            try:
                driver = _text(pynvml.nvmlSystemGetDriverVersion())
            except Exception as exc:
                errors.append(f"driver version: {exc}")
            try:
                v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())  # 13000 -> "13.0", 12080 -> "12.8"
                cuda = f"{v // 1000}.{v % 1000 // 10}"
            except Exception as exc:
                errors.append(f"CUDA version: {exc}")
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                    name = _text(pynvml.nvmlDeviceGetName(handle))
                    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                except Exception as exc:  # one bad GPU (fallen off the bus) must not hide the others
                    errors.append(f"GPU {i}: {exc}")
                    continue
                try:
                    memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
                except Exception:  # NotSupported on unified-memory GPUs
                    memory = 0
                try:
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                except Exception:
                    uuid = None
                gpus.append(GpuInfo(i, name, f"{major}.{minor}", memory, uuid))
    except NvmlUnavailable as exc:
        return [], None, None, str(exc)
    except Exception as exc:
        errors.append(str(exc) or type(exc).__name__)
    return gpus, driver, cuda, "; ".join(errors) or None


# --------------------------------------------------------------------------- GPUs via nvidia-smi

SMI_QUERY = "index,name,compute_cap,memory.total,uuid,driver_version"


def parse_nvidia_smi(csv_text: str, banner: str) -> tuple[list[GpuInfo], str | None, str | None]:
    """(gpus, driver, CUDA version) from ``nvidia-smi --query-gpu=SMI_QUERY --format=csv,noheader,nounits``
    and the plain ``nvidia-smi`` banner (the only place it prints the CUDA version the driver supports)."""
    gpus, driver = [], None
    for row in csv.reader(io.StringIO(csv_text), skipinitialspace=True):
        if len(row) < 6 or not row[0].strip().isdigit():
            continue
        index, name, cc, memory, uuid, driver = (c.strip() for c in row[:6])
        if not re.fullmatch(r"\d+\.\d+", cc):
            continue  # "[N/A]" on drivers too old to report it
        mib = int(memory) if memory.isdigit() else 0
        gpus.append(GpuInfo(int(index), name, cc, mib, None if uuid.startswith("[") else uuid))
    found = re.search(r"CUDA Version:\s*(\d+\.\d+)", banner)
    return gpus, driver, found.group(1) if found else None


def probe_gpus_smi() -> tuple[list[GpuInfo], str | None, str | None, str | None]:
    """The same as ``probe_gpus`` through the ``nvidia-smi`` command; (.., error) when it cannot."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], None, None, "nvidia-smi not found"
    try:
        query = subprocess.run([exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
        banner = subprocess.run([exe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], None, None, f"nvidia-smi: {exc}"
    if query.returncode != 0:
        return [], None, None, f"nvidia-smi: {(query.stderr or query.stdout).strip()[:200]}"
    gpus, driver, cuda = parse_nvidia_smi(query.stdout, banner.stdout)
    return gpus, driver, cuda, None if gpus else "nvidia-smi listed no GPU"


def probe_any_gpus() -> tuple[list[GpuInfo], str | None, str | None, str | None, str | None]:
    """NVML first, nvidia-smi where NVML is missing or fails: (gpus, driver, cuda, nvml error, source)."""
    gpus, driver, cuda, nvml_error = probe_gpus()
    if gpus:
        return gpus, driver, cuda, nvml_error, "nvml"
    smi_gpus, smi_driver, smi_cuda, smi_error = probe_gpus_smi()
    if smi_gpus:
        return smi_gpus, smi_driver, smi_cuda, nvml_error, "nvidia-smi"
    errors = "; ".join(e for e in (nvml_error, smi_error) if e) or None
    return [], driver, cuda, errors, None


# --------------------------------------------------------------------------- Jetson


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


def l4t_to_jetpack(l4t: str) -> str | None:
    """``36.4.3`` → ``6.2``; None for a release line the table does not know."""
    try:
        parts = tuple(int(p) for p in l4t.split("."))
    except ValueError:
        return None
    for n in range(len(parts), 0, -1):
        if parts[:n] in L4T_JETPACK:
            return L4T_JETPACK[parts[:n]]
    return None


def _parse_tegra_release(text: str) -> str | None:
    # "# R36 (release), REVISION: 4.3, GCID: ..." -> "36.4.3"
    head = text.lstrip("# \t").split(",")
    major = head[0].split()[0].lstrip("R") if head and head[0].split() else ""
    revision = next((p.split(":", 1)[1].strip() for p in head if p.strip().startswith("REVISION:")), "")
    if not major.isdigit():
        return None
    return f"{major}.{revision}" if revision else major


def _meminfo_mib(root: Path) -> int | None:
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def probe_jetson(root: Path = Path("/")) -> JetsonInfo | None:
    """Return the Jetson board under ``root``, or None when this is not a Jetson."""
    release = _read(root / "etc/nv_tegra_release")
    compatible = [c for c in (_read(root / "proc/device-tree/compatible") or "").split("\0") if c]
    socs = [c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")]
    if release is None and not socs:
        return None
    model = (_read(root / "proc/device-tree/model") or "").strip("\0 \n") or "NVIDIA Jetson"
    l4t = (_parse_tegra_release(release) if release else None) or ""
    cc = next((TEGRA_CCS[s] for s in socs if s in TEGRA_CCS), None)
    return JetsonInfo(model, l4t, l4t_to_jetpack(l4t) if l4t else None, cc, _meminfo_mib(root))


# --------------------------------------------------------------------------- modules


def _import_version(name: str) -> tuple[str | None, str | None]:
    """Return (version, None) when ``name`` imports, else (None, why)."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # OSError/RuntimeError from a native library is as fatal as ImportError
        return None, _error(exc)
    return str(getattr(module, "__version__", "") or "unknown"), None


def probe_modules() -> tuple[dict[str, str | None], dict[str, str]]:
    """Return ({module: version or None}, {module: why it did not import}) for every backend module."""
    versions: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for name in BACKEND_MODULES.values():
        versions[name], err = _import_version(name)
        if err is not None:
            errors[name] = err
    return versions, errors


# --------------------------------------------------------------------------- ONNX Runtime's CUDA provider


def _ort_cuda_fields(gpus: list[GpuInfo], modules: dict[str, str | None]) -> dict[str, str | None]:
    if not modules.get(ORT_MODULE):
        return {}
    if not gpus:
        return {"ort_cuda_error": "no NVIDIA GPU"}
    cuda, cudnn, error = probe_ort_cuda()
    return {"ort_cuda": cuda, "cudnn_version": cudnn, "ort_cuda_error": error}


def ort_cuda_targets(probe: MachineProbe) -> list[Target]:
    """``onnxruntime/cuda-smXY`` for each GPU's compute capability, where ONNX Runtime's CUDA provider loads."""
    if not (probe.modules.get(ORT_MODULE) and probe.ort_cuda):
        return []
    archs = {f"{ORT_CUDA_PREFIX}{arch_of_cc(g.compute_capability)}" for g in probe.gpus}
    return [Target(Backend.ONNXRUNTIME, a) for a in sorted(archs) if a in ARCHES[Backend.ONNXRUNTIME]]


# --------------------------------------------------------------------------- the machine


def _os_name(root: Path) -> str:
    release = _platform.release().split("-")[0]
    kernel = f"{_platform.system()} {'.'.join(release.split('.')[:2])}".strip()
    for rel in ("etc/os-release", "usr/lib/os-release"):
        for line in (_read(root / rel) or "").splitlines():
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


def _devices(probe: MachineProbe) -> list[tuple[str, str | None]]:
    """(label, compute capability) of every GPU, the Jetson's included unless NVML already lists it."""
    devices: list[tuple[str, str | None]] = [(f"GPU {g.index} {g.name}", g.compute_capability) for g in probe.gpus]
    j = probe.jetson
    if j and not any(g.compute_capability == j.compute_capability for g in probe.gpus):
        devices.append((f"Jetson {j.model}", j.compute_capability))
    return devices


def buildable_targets(probe: MachineProbe) -> list[Target]:
    """Return the sorted targets this machine can build."""
    targets: set[Target] = set()
    if probe.modules.get(ORT_MODULE) and f"cpu-{probe.platform}" in ARCHES[Backend.ONNXRUNTIME]:
        targets.add(Target(Backend.ONNXRUNTIME, f"cpu-{probe.platform}"))
    targets.update(ort_cuda_targets(probe))
    # TensorRT-RTX compiles ahead of time without a GPU, but only ships x86_64 wheels.
    if probe.modules.get(RTX_MODULE) and probe.platform == "x86_64":
        targets.update(Target(Backend.TENSORRT_RTX, a) for a in ARCHES[Backend.TENSORRT_RTX])
    # Full TensorRT builds only for the GPU it runs on, and only when its module imports.
    if probe.modules.get(TRT_MODULE):
        for _, cc in _devices(probe):
            if cc and arch_of_cc(cc) in ARCHES[Backend.TENSORRT]:
                targets.add(Target(Backend.TENSORRT, arch_of_cc(cc)))
    return sorted(targets)


def benchmark_targets(probe: MachineProbe) -> list[Target]:
    """The targets whose engines this machine can run, so benchmark: a GPU of compute capability 8.6 with
    tensorrt_rtx importable serves ``tensorrt-rtx/sm86`` (and ``tensorrt-rtx/portable``, which runs there);
    full TensorRT serves its GPU's architecture; ONNX Runtime serves the worker's CPU."""
    targets: set[Target] = set()
    if probe.modules.get(ORT_MODULE) and f"cpu-{probe.platform}" in ARCHES[Backend.ONNXRUNTIME]:
        targets.add(Target(Backend.ONNXRUNTIME, f"cpu-{probe.platform}"))
    targets.update(ort_cuda_targets(probe))
    for _, cc in _devices(probe):
        if not cc:
            continue
        arch = arch_of_cc(cc)
        if probe.modules.get(RTX_MODULE) and probe.platform == "x86_64":
            if arch in ARCHES[Backend.TENSORRT_RTX]:
                targets.add(Target(Backend.TENSORRT_RTX, arch))
            if cc in RTX_PORTABLE_CCS:
                targets.add(Target(Backend.TENSORRT_RTX, "portable"))
        if probe.modules.get(TRT_MODULE) and arch in ARCHES[Backend.TENSORRT]:
            targets.add(Target(Backend.TENSORRT, arch))
    return sorted(targets)


def benchmark_pending_reason(target: Target) -> str:
    """What the catalog says about an engine no live worker can benchmark."""
    if target.is_ort_cuda:
        return (f"benchmark pending: no worker with a GPU of compute capability {target.compute_capability} "
                "and ONNX Runtime's CUDA execution provider")
    if target.backend is Backend.ONNXRUNTIME:
        return f"benchmark pending: no worker with ONNX Runtime on a {target.arch.removeprefix('cpu-')} CPU"
    if target.arch == "portable":
        return (f"benchmark pending: no worker with a GPU of compute capability {'/'.join(RTX_PORTABLE_CCS)} "
                f"and {BACKEND_MODULES[target.backend]}")
    return f"benchmark pending: no worker with an {target.arch} GPU and {BACKEND_MODULES[target.backend]}"


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
        lines.append(f"NVML: {probe.nvml_error}" if probe.gpus else f"no GPU found via NVML or nvidia-smi: {probe.nvml_error}")
    if j := probe.jetson:
        jp = f"JetPack {j.jetpack}" if j.jetpack else "JetPack unknown"
        lines.append(f"Jetson: {j.model}, L4T {j.l4t_release or 'unknown'} ({jp}), "
                     f"compute capability {j.compute_capability or 'unknown'}")

    def missing(backend: Backend, module: str) -> str:
        return f"{backend.value}: not importable ({probe.module_errors.get(module, 'no version')})"

    # tensorrt: one line per device, since each GPU decides its own target.
    trt = probe.modules.get(TRT_MODULE)
    devices = _devices(probe)
    if not devices:
        why = f"no GPU ({probe.nvml_error})" if probe.nvml_error else "no GPU"
        lines.append((missing(Backend.TENSORRT, TRT_MODULE) if not trt else f"tensorrt {trt}: {why}")
                     + ": no tensorrt target served")
    for label, cc in devices:
        arch = arch_of_cc(cc) if cc else None
        if arch not in ARCHES[Backend.TENSORRT]:
            lines.append(f"tensorrt: {label} has compute capability {cc or 'unknown'}"
                         f"{f' ({arch})' if arch else ''}, which tensorrt does not build for: no target")
        elif not trt:
            lines.append(f"{missing(Backend.TENSORRT, TRT_MODULE)}: tensorrt/{arch} not served ({label})")
        else:
            lines.append(f"tensorrt {trt}: serves tensorrt/{arch} ({label})")

    rtx = probe.modules.get(RTX_MODULE)
    if not rtx:
        lines.append(f"{missing(Backend.TENSORRT_RTX, RTX_MODULE)}: no tensorrt-rtx target served")
    elif probe.platform != "x86_64":
        lines.append(f"tensorrt-rtx {rtx}: importable, but TensorRT-RTX builds only on x86_64, not {probe.platform}: not served")
    else:
        lines.append(f"tensorrt-rtx {rtx}: serves tensorrt-rtx/{{{','.join(ARCHES[Backend.TENSORRT_RTX])}}} (ahead of time, no GPU needed)")

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
            lines.append(f"onnxruntime {ort} CUDA (built for CUDA {probe.ort_cuda}, cuDNN "
                         f"{probe.cudnn_version or 'not found'}): serves {served}")
        elif probe.ort_cuda:
            lines.append(f"onnxruntime {ort} CUDA: no GPU of a compute capability it has a target for: not served")
        else:
            lines.append(f"onnxruntime {ort} CUDA: {probe.ort_cuda_error}: no onnxruntime/cuda target served")

    targets = buildable_targets(probe)
    lines.append(f"buildable targets: {', '.join(map(str, targets)) if targets else 'none'}")
    return lines


def machine_fingerprint(probe: MachineProbe, gpu_index: int = 0) -> Machine:
    """Return this machine as a deploy-time ``Machine``: GPU ``gpu_index`` (or the Jetson) plus runtimes."""
    gpu = next((g for g in probe.gpus if g.index == gpu_index), None)
    if probe.gpus and gpu is None:
        raise ValueError(f"no GPU {gpu_index}; this machine has {', '.join(str(g.index) for g in probe.gpus)}")
    j = probe.jetson
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
        lean_runtime=_import_version(LEAN_MODULE)[0] is not None,
        ort_version=probe.modules.get(ORT_MODULE),
        ort_cuda=bool(probe.ort_cuda and gpu),
        platform=probe.platform,
        os=probe.os,
        jetpack=j.jetpack if j else None,
        cpu_name=probe.cpu_name,
    )


def this_machine(**overrides: Any) -> Machine:
    """This machine as a deploy-time fingerprint, with any field given a non-None override replaced.

    Without a GPU the platform, OS and importable runtimes still count (a CPU-only deploy machine).
    """
    probe = probe_machine()
    try:
        machine = machine_fingerprint(probe)
    except ValueError:
        machine = Machine.detected(platform=probe.platform, os=probe.os, trt_version=probe.modules.get(TRT_MODULE),
                                   trt_rtx_version=probe.modules.get(RTX_MODULE),
                                   ort_version=probe.modules.get(ORT_MODULE))
    # Through the constructor again: an override is checked by the same rules as a request's field.
    return replace(machine, **{key: value for key, value in overrides.items() if value is not None})


def main(argv: list[str] | None = None) -> int:
    """Print the probe as JSON, then the report (which ends with the buildable targets)."""
    parser = argparse.ArgumentParser(prog="python -m enginefarm.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/"), help="read /etc and /proc under this directory")
    args = parser.parse_args(argv)
    probe = probe_machine(args.root)
    print(json.dumps(probe.to_dict(), indent=2))
    for line in probe_report(probe):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
