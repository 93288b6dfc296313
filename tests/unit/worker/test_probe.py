"""Worker probe: this (GPU-less) machine for real, a recorded Jetson root, and constructed machines."""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
from pathlib import Path

import pytest

from enginefarm.core.domain import Backend, Target
from enginefarm.core.probe import gpus as gpu_probe
from enginefarm.core.probe import jetson as jetson_probe
from enginefarm.core.probe import machineprobe, policy
from enginefarm.core.probe import modules as module_probe
from enginefarm.core.probe import report as probe_text
from enginefarm.core.probe.gpus import GpuInfo
from enginefarm.core.probe.jetson import JetsonInfo
from enginefarm.core.probe.machineprobe import MachineProbe

DATA = Path(__file__).parent / "data"
JETSON_ROOT = DATA / "jetson_orin"
X86_ROOT = DATA / "x86_debian"

TRT_MISSING = "No module named 'tensorrt'"
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", "9.0", 81559, "GPU-6f1e2b2a-0000-0000-0000-000000000000")


def machine(*, platform="x86_64", gpus=(), jetson=None, modules=None, errors=None, nvml_error=None) -> MachineProbe:
    return MachineProbe(
        hostname="node1",
        platform=platform,
        os="Linux 6.8 (Ubuntu 24.04.1 LTS)",
        gpus=list(gpus),
        driver_version="580.82.07" if gpus else None,
        cuda_version="13.0" if gpus else None,
        jetson=jetson,
        modules=modules or {},
        module_errors=errors or {},
        nvml_error=nvml_error,
    )


def T(text: str) -> Target:
    return Target.parse(text)


# --------------------------------------------------------------------------- this machine, for real


@pytest.fixture(scope="module")
def real() -> MachineProbe:
    return machineprobe.probe_machine(X86_ROOT)


def test_real_probe_without_gpu(real):
    assert real.gpus == [] and real.driver_version is None and real.cuda_version is None
    assert real.nvml_error  # e.g. "NVML Shared Library Not Found"
    assert real.platform == "x86_64"
    assert real.os.startswith("Linux ") and real.os.endswith("(Debian GNU/Linux 12 (bookworm))")
    assert real.jetson is None
    assert real.modules["tensorrt"] is None and "tensorrt" in real.module_errors["tensorrt"]
    assert real.modules["tensorrt_rtx"] and real.modules["onnxruntime"]
    assert "tensorrt_rtx" not in real.module_errors and "onnxruntime" not in real.module_errors
    json.dumps(real.to_dict())


def test_real_buildable_targets(real):
    targets = policy.buildable_targets(real)
    assert T("tensorrt-rtx/sm86") in targets and T("onnxruntime/cpu-x86_64") in targets
    assert not [t for t in targets if t.backend is Backend.TENSORRT]
    assert targets == sorted(set(targets))
    report = probe_text.probe_report(real)
    assert any(line.startswith("no GPU found via NVML or nvidia-smi: ") for line in report)
    assert any(line.startswith("tensorrt: not importable (") and "no tensorrt target" in line for line in report)


def test_real_probe_gpus_reports_nvml_error():
    gpus, driver, cuda, err = gpu_probe.probe_gpus()
    assert (gpus, driver, cuda) == ([], None, None) and err


def test_main_prints_json_then_report(capsys):
    assert probe_text.main(["--root", str(JETSON_ROOT)]) == 0
    out = capsys.readouterr().out
    data, end = json.JSONDecoder().raw_decode(out)
    assert data["jetson"]["jetpack"] == "6.2" and "modules" in data
    assert out[end:].strip().splitlines()[-1].startswith("buildable targets: ")


# --------------------------------------------------------------------------- Jetson


def test_recorded_jetson_orin():
    j = jetson_probe.probe_jetson(JETSON_ROOT)
    assert j == JetsonInfo("NVIDIA Jetson AGX Orin Developer Kit", "36.4.3", "6.2", "8.7", 62827)


def test_non_jetson_roots(tmp_path):
    assert jetson_probe.probe_jetson(X86_ROOT) is None
    assert jetson_probe.probe_jetson(tmp_path) is None


def test_jetson_without_release_file(tmp_path):
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/compatible").write_bytes(b"nvidia,p3668-0001\0nvidia,tegra194\0")
    j = jetson_probe.probe_jetson(tmp_path)
    assert j and j.compute_capability == "7.2" and j.l4t_release == "" and j.jetpack is None


@pytest.mark.parametrize(
    "l4t, jetpack",
    [
        ("36.4.3", "6.2"),
        ("36.4.4", "6.2.1"),
        ("36.4.7", "6.2"),
        ("36.4.0", "6.1"),
        ("36.3.0", "6.0"),
        ("35.4.1", "5.1.2"),
        ("35.9.9", "5.1"),
        ("38.2.0", "7.0"),
        ("32.7.4", None),
        ("garbage", None),
    ],
)
def test_l4t_to_jetpack(l4t, jetpack):
    assert jetson_probe.l4t_to_jetpack(l4t) == jetpack


def test_jetson_machine_probe_os(monkeypatch):
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: ([], None, None, "NVML Shared Library Not Found"))
    monkeypatch.setattr(machineprobe._platform, "machine", lambda: "arm64")
    p = machineprobe.probe_machine(JETSON_ROOT)
    assert p.platform == "aarch64" and p.os.endswith("(Ubuntu 22.04.5 LTS)") and p.jetson.compute_capability == "8.7"


# --------------------------------------------------------------------------- constructed machines


def test_h100_with_tensorrt():
    p = machine(
        gpus=[H100],
        modules={"tensorrt": "10.13.3.9", "tensorrt_rtx": None, "onnxruntime": None},
        errors={"tensorrt_rtx": "No module named 'tensorrt_rtx'", "onnxruntime": "No module named 'onnxruntime'"},
    )
    assert policy.buildable_targets(p) == [T("tensorrt/sm90")]
    assert any("tensorrt 10.13.3.9: serves tensorrt/sm90" in line for line in probe_text.probe_report(p))


def test_h100_without_tensorrt_serves_no_tensorrt_target():
    p = machine(
        gpus=[H100],
        modules={"tensorrt": None, "tensorrt_rtx": "1.7.1.116", "onnxruntime": "1.23.2"},
        errors={"tensorrt": TRT_MISSING},
    )
    targets = policy.buildable_targets(p)
    assert not [t for t in targets if t.backend is Backend.TENSORRT]
    assert T("tensorrt-rtx/sm120") in targets and T("onnxruntime/cpu-x86_64") in targets
    assert (
        f"tensorrt: not importable ({TRT_MISSING}): tensorrt/sm90 not served (GPU 0 {H100.name})"
        in probe_text.probe_report(p)
    )


def test_jetson_with_tensorrt_on_aarch64():
    jetson = JetsonInfo("NVIDIA Jetson AGX Orin Developer Kit", "36.4.3", "6.2", "8.7")
    p = machine(
        platform="aarch64",
        jetson=jetson,
        modules={"tensorrt": "10.3.0", "tensorrt_rtx": "1.7.1.116", "onnxruntime": "1.23.0"},
    )
    targets = policy.buildable_targets(p)
    assert targets == [T("onnxruntime/cpu-aarch64"), T("tensorrt/sm87")]
    assert any("only on x86_64" in line for line in probe_text.probe_report(p))


def test_unknown_compute_capability_gives_no_target():
    pascal = GpuInfo(0, "NVIDIA GeForce GTX 1080", "6.1", 8192)
    p = machine(
        gpus=[pascal, H100.__class__(1, H100.name, "9.0", H100.memory_mib)],
        modules={"tensorrt": "10.13.3.9", "tensorrt_rtx": None, "onnxruntime": None},
    )
    assert policy.buildable_targets(p) == [T("tensorrt/sm90")]
    assert any("GTX 1080" in line and "6.1" in line and "no target" in line for line in probe_text.probe_report(p))


def test_same_arch_twice_is_one_target():
    p = machine(gpus=[H100, GpuInfo(1, H100.name, "9.0", 81559)], modules={"tensorrt": "10.13.3.9"})
    assert policy.buildable_targets(p) == [T("tensorrt/sm90")]


# --------------------------------------------------------------------------- fingerprint


def test_machine_fingerprint_gpu(monkeypatch):
    monkeypatch.setattr(
        machineprobe, "import_version", lambda name: ("10.13.3.9", None) if name == "tensorrt_lean" else (None, "x")
    )
    p = machine(gpus=[H100], modules={"tensorrt": "10.13.3.9", "tensorrt_rtx": "1.7.1.116", "onnxruntime": "1.23.2"})
    m = machineprobe.machine_fingerprint(p)
    assert (m.gpu_name, m.compute_capability, m.memory_mib) == (H100.name, "9.0", 81559)
    assert (m.driver_version, m.cuda_version, m.trt_version, m.trt_rtx_version) == (
        "580.82.07",
        "13.0",
        "10.13.3.9",
        "1.7.1.116",
    )
    assert m.lean_runtime and m.platform == "x86_64" and m.os == p.os and m.jetpack is None and not m.is_jetson
    with pytest.raises(ValueError, match="no GPU 3"):
        machineprobe.machine_fingerprint(p, gpu_index=3)


def test_machine_fingerprint_jetson_and_cpu_only(real):
    jetson = jetson_probe.probe_jetson(JETSON_ROOT)
    m = machineprobe.machine_fingerprint(machine(platform="aarch64", jetson=jetson, modules={"tensorrt": "10.3.0"}))
    assert (m.gpu_name, m.compute_capability, m.memory_mib, m.jetpack) == (jetson.model, "8.7", 62827, "6.2")
    assert m.is_jetson and m.trt_version == "10.3.0" and m.trt_rtx_version is None and not m.lean_runtime
    m = machineprobe.machine_fingerprint(real)
    assert m.gpu_name is None and m.compute_capability is None and m.trt_rtx_version == real.modules["tensorrt_rtx"]


# --------------------------------------------------------------------------- module and NVML failures


def test_probe_modules_reports_native_library_failure(monkeypatch):
    real_import = importlib.import_module

    def fake_import(name, *args):
        if name == "tensorrt":
            raise OSError("libnvinfer.so.10: cannot open shared object file: No such file or directory")
        if name == "onnxruntime":
            return types.SimpleNamespace()  # imports, but has no __version__
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    versions, errors = module_probe.probe_modules()
    assert versions["tensorrt"] is None and errors["tensorrt"].startswith("OSError: libnvinfer.so.10")
    assert versions["onnxruntime"] == "unknown" and versions["tensorrt_rtx"]
    assert set(versions) == {"tensorrt", "tensorrt_rtx", "onnxruntime"} and set(errors) == {"tensorrt"}


class FakeNvml(types.ModuleType):
    """pynvml as an H100 node answers it: names as bytes, like older bindings."""

    def __init__(self, fail_init=False):
        super().__init__("pynvml")
        self.fail_init, self.shutdowns = fail_init, 0

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        if i == 1:
            raise RuntimeError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=85520809984)

    def nvmlDeviceGetUUID(self, h):
        return b"GPU-6f1e2b2a"

    def nvmlSystemGetDriverVersion(self):
        return "580.82.07"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000


def test_probe_gpus_with_fake_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, driver, cuda, err = gpu_probe.probe_gpus()
    assert gpus == [GpuInfo(0, "NVIDIA H100 80GB HBM3", "9.0", 81559, "GPU-6f1e2b2a")]
    assert (driver, cuda) == ("580.82.07", "13.0")
    assert err == "GPU 1: GPU is lost" and fake.shutdowns == 1


def test_probe_gpus_init_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail_init=True))
    assert gpu_probe.probe_gpus() == ([], None, None, "Driver Not Loaded")


# --- nvidia-smi, where NVML cannot be used: recorded on an H200 together with NVML's answers

SMI = DATA / "nvidia_smi_h200"


def test_nvidia_smi_parse_matches_nvml_on_a_real_h200():
    gpus, driver, cuda = gpu_probe.parse_nvidia_smi((SMI / "query.csv").read_text(), (SMI / "banner.txt").read_text())
    # nvml.txt: name, (major, minor), total MiB, driver, CUDA driver version, uuid as NVML gave them.
    found = re.fullmatch(r"(.+) \((\d+), (\d+)\) (\d+) (\S+) (\d+) (\S+)\n?", (SMI / "nvml.txt").read_text())
    name, major, minor, memory, nvml_driver, cuda_int, uuid = found.groups()
    cc = f"{major}.{minor}"
    assert [(g.index, g.name, g.compute_capability, g.memory_mib, g.uuid) for g in gpus] == [
        (0, name, cc, int(memory), uuid)
    ]
    assert driver == nvml_driver == "580.159.04"
    assert cuda == f"{int(cuda_int) // 1000}.{int(cuda_int) % 1000 // 10}" == "13.0"


@pytest.mark.parametrize(
    "csv_text, expected",
    [
        (
            "0, Tesla T4, 7.5, 15360, GPU-1, 535.104.05\n1, NVIDIA A10, 8.6, 23028, GPU-2, 535.104.05\n",
            [(0, "7.5", 15360), (1, "8.6", 23028)],
        ),
        ("0, NVIDIA GeForce RTX 3090, [N/A], 24576, GPU-1, 470.57.02\n", []),  # too old to report compute_cap
        ("0, Orin, 8.7, [N/A], [N/A], 540.4.0\n", [(0, "8.7", 0)]),
        ("Failed to initialize NVML: Driver/library version mismatch\n", []),
    ],
)
def test_nvidia_smi_parse_edge_cases(csv_text, expected):
    gpus, _, cuda = gpu_probe.parse_nvidia_smi(csv_text, "no banner")
    assert [(g.index, g.compute_capability, g.memory_mib) for g in gpus] == expected
    assert cuda is None


def test_nvidia_smi_is_the_fallback_when_nvml_fails(monkeypatch):
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: ([], None, None, "NVML Shared Library Not Found"))
    monkeypatch.setattr(
        gpu_probe,
        "probe_gpus_smi",
        lambda: gpu_probe.parse_nvidia_smi((SMI / "query.csv").read_text(), (SMI / "banner.txt").read_text()) + (None,),
    )
    probe = machineprobe.probe_machine(X86_ROOT)
    assert probe.gpu_source == "nvidia-smi" and probe.gpus[0].compute_capability == "9.0"
    assert probe.nvml_error == "NVML Shared Library Not Found"
    assert any(
        line.startswith("GPUs read with nvidia-smi (NVML: NVML Shared Library Not Found)")
        for line in probe_text.probe_report(probe)
    )
    assert machineprobe.machine_fingerprint(probe).compute_capability == "9.0"


def test_real_nvidia_smi_absent_here_is_reported():
    gpus, _, _, err = gpu_probe.probe_gpus_smi()
    assert gpus == [] and err


def test_this_machine_fingerprint_and_overrides():
    here = machineprobe.this_machine()
    assert here.platform == machineprobe.normalize_platform(__import__("platform").machine())
    assert here.trt_rtx_version == module_probe.probe_modules()[0]["tensorrt_rtx"]  # importable here
    assert here.compute_capability is None  # no GPU on this machine
    told = machineprobe.this_machine(compute_capability="8.6", gpu_name="NVIDIA A10", platform=None)
    assert (told.compute_capability, told.gpu_name, told.platform) == ("8.6", "NVIDIA A10", here.platform)


# --------------------------------------------------------------------------- ONNX Runtime's CUDA provider


def test_the_cpu_onnxruntime_here_has_no_cuda_provider():
    machineprobe.probe_ort_cuda.cache_clear()
    cuda, cudnn, why = machineprobe.probe_ort_cuda()
    assert (
        cuda is None and cudnn is None and "has no CUDAExecutionProvider (that is the onnxruntime-gpu package)" in why
    )


def test_h100_with_onnxruntime_gpu_serves_the_cuda_target():
    p = machine(
        gpus=[H100],
        modules={"tensorrt": None, "tensorrt_rtx": None, "onnxruntime": "1.31.1"},
        errors={"tensorrt": TRT_MISSING},
    )
    p.ort_cuda, p.cudnn_version = "13.0", "9.19.0"
    cuda, cpu = T("onnxruntime/cuda-sm90"), T("onnxruntime/cpu-x86_64")
    assert policy.buildable_targets(p) == [cpu, cuda] and policy.benchmark_targets(p) == [cpu, cuda]
    assert (
        "onnxruntime 1.31.1 CUDA (built for CUDA 13.0, cuDNN 9.19.0): serves onnxruntime/cuda-sm90"
        in probe_text.probe_report(p)
    )
    m = machineprobe.machine_fingerprint(p)
    assert m.ort_cuda and m.ort_version == "1.31.1" and m.compute_capability == "9.0"
    assert "compute capability 9.0 and ONNX Runtime's CUDA execution provider" in policy.benchmark_pending_reason(cuda)


def test_a_cuda_provider_that_does_not_load_serves_no_cuda_target():
    p = machine(gpus=[H100], modules={"onnxruntime": "1.31.1"})
    p.ort_cuda_error = "CUDAExecutionProvider does not load: libcublasLt.so.13: cannot open shared object file"
    assert policy.buildable_targets(p) == [T("onnxruntime/cpu-x86_64")]
    assert (
        "onnxruntime 1.31.1 CUDA: CUDAExecutionProvider does not load: libcublasLt.so.13: cannot open shared "
        "object file: no onnxruntime/cuda target served"
    ) in probe_text.probe_report(p)
    assert not machineprobe.machine_fingerprint(p).ort_cuda


def test_naming_a_gpu_runtime_describes_the_machines_runtimes_whole():
    """A workstation with TensorRT-RTX importable that describes a TensorRT server (--cc 8.6 --trt 10.3.0) must not
    keep its own TensorRT-RTX in the fingerprint: that machine would be handed a TensorRT-RTX plan it cannot load."""
    assert machineprobe.this_machine().trt_rtx_version  # importable here
    told = machineprobe.this_machine(compute_capability="8.6", trt_version="10.3.0")
    assert (told.trt_version, told.trt_rtx_version, told.gpu_runtimes) == ("10.3.0", None, ["TensorRT"])
    both = machineprobe.this_machine(compute_capability="8.6", trt_version="10.3.0", trt_rtx_version="1.7.1.116")
    assert both.gpu_runtimes == ["TensorRT", "TensorRT-RTX"]
    # Naming only the GPU keeps this machine's runtimes: "a machine like this one, with that GPU".
    assert (
        machineprobe.this_machine(compute_capability="8.6").trt_rtx_version
        == module_probe.probe_modules()[0]["tensorrt_rtx"]
    )
