"""The machine's NVIDIA GPUs, driver and CUDA version: through NVML, else through nvidia-smi's CSV."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from enginefarm.core.nvml import NvmlUnavailable, nvml_session


@dataclass
class GpuInfo:
    index: int
    name: str
    compute_capability: str
    memory_mib: int  # 0 where NVML cannot say (unified-memory boards)
    uuid: str | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def error_text(exc: BaseException) -> str:
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
            except Exception as exc:  # noqa: BLE001 - one failed NVML query is reported, the rest goes on
                errors.append(f"driver version: {exc}")
            try:
                v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())  # 13000 -> "13.0", 12080 -> "12.8"
                cuda = f"{v // 1000}.{v % 1000 // 10}"
            except Exception as exc:  # noqa: BLE001 - one failed NVML query is reported, the rest goes on
                errors.append(f"CUDA version: {exc}")
            for i in range(pynvml.nvmlDeviceGetCount()):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                    name = _text(pynvml.nvmlDeviceGetName(handle))
                    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                except Exception as exc:  # noqa: BLE001 - one bad GPU (fallen off the bus) must not hide the others
                    errors.append(f"GPU {i}: {exc}")
                    continue
                try:
                    memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20)
                except Exception:  # noqa: BLE001 - NotSupported on unified-memory GPUs
                    memory = 0
                try:
                    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                except Exception:  # noqa: BLE001 - a GPU without a UUID is still listed
                    uuid = None
                gpus.append(GpuInfo(i, name, f"{major}.{minor}", memory, uuid))
    except NvmlUnavailable as exc:
        return [], None, None, str(exc)
    except Exception as exc:  # noqa: BLE001 - NVML's own errors: reported with the probe, never fatal
        errors.append(str(exc) or type(exc).__name__)
    return gpus, driver, cuda, "; ".join(errors) or None


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
        query = subprocess.run(
            [exe, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
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
