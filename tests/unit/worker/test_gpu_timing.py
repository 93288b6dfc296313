"""GPU timing (gpu_timing) and the CUDA calls under it (cuda_driver) without a GPU: the phase arithmetic, error
reporting, dtype mapping, NVML fallbacks, and that a machine without a CUDA driver (this one) gets a clear
BackendMissing. The GPU paths themselves are proven by bench/gpu_timing.py (docs/gpu-timing.md)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import tensorrt_rtx as trt
from cuda.bindings import driver as drv
from cuda.bindings import nvrtc

from enginefarm.core import stats
from enginefarm.core.errors import BackendMissing, BuildFailed
from enginefarm.measure import cuda_driver as D
from enginefarm.measure import gpu_timing as G
from enginefarm.measure import trt_runner as R

NO_DRIVER = "no CUDA driver on this worker: "


# --------------------------------------------------------------------------- phases from event times


def test_iteration_from_event_times_splits_the_phases():
    it = G.iteration_from_event_times([0.0, 1.25, 3.75, 4.5])
    assert it == stats.Iteration(e2e=4.5, compute=2.5, h2d=1.25, d2h=0.75)


def test_iteration_from_event_times_any_origin():
    it = G.iteration_from_event_times([10.0, 10.5, 12.0, 12.25])
    assert (it.e2e, it.compute, it.h2d, it.d2h) == pytest.approx((2.25, 1.5, 0.5, 0.25))


def test_phases_without_copies_are_none_not_zero():
    it = G.iteration_from_event_times([0.0, 0.0, 2.0, 2.0], h2d=False, d2h=False)
    assert it == stats.Iteration(e2e=2.0, compute=2.0, h2d=None, d2h=None)
    # and they stay out of the summary rather than dragging its statistics to 0
    summary = stats.Measurement([it, it], wall_s=1.0, warmup_iterations=1, warmup_s=0.2).summary()
    assert summary["h2d"] is None and summary["compute"]["median"] == 2.0


def test_phases_sum_to_e2e():
    times = [3.0, 3.1, 4.9, 5.0]
    it = G.iteration_from_event_times(times)
    assert it.h2d + it.compute + it.d2h == pytest.approx(it.e2e)


@pytest.mark.parametrize("times", [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
def test_event_times_need_four_events(times):
    with pytest.raises(ValueError, match="4 events"):
        G.iteration_from_event_times(times)


def test_event_times_out_of_stream_order_are_refused():
    with pytest.raises(ValueError, match="not in stream order"):
        G.iteration_from_event_times([0.0, 2.0, 1.0, 3.0])


# --------------------------------------------------------------------------- no driver here


def test_cuda_device_without_a_driver_is_backend_missing():
    with pytest.raises(BackendMissing) as info:
        D.CudaDevice(0)
    message = str(info.value)
    assert message.startswith(NO_DRIVER)
    assert "NVIDIA" in message and "driver" in message[len(NO_DRIVER) :]  # the loader's own explanation follows
    assert isinstance(info.value.__cause__, RuntimeError)  # cuda.pathfinder's DynamicLibNotFoundError
    assert info.value.status_code == 409


def test_engine_runner_without_a_driver_fails_before_touching_tensorrt():
    untouchable = SimpleNamespace()  # any TensorRT call would raise AttributeError
    with pytest.raises(BackendMissing, match=NO_DRIVER):
        R.TensorRTEngineRunner(b"not an engine", untouchable)


def test_missing_cuda_bindings_is_backend_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    monkeypatch.delattr(sys.modules["cuda.bindings"], "driver")
    with pytest.raises(BackendMissing, match="cuda-bindings is not importable"):
        D.cuda_init()


# --------------------------------------------------------------------------- checked calls


def test_check_unpacks_values():
    ok = drv.CUresult.CUDA_SUCCESS
    assert D.check("cuInit", (ok,)) is None
    assert D.check("cuDeviceGetCount", (ok, 2)) == 2
    assert D.check("cuMemGetInfo", (ok, 10, 20)) == (10, 20)


def test_check_names_the_call_and_the_result():
    with pytest.raises(D.CudaError) as info:
        D.check("cuMemAlloc", (drv.CUresult.CUDA_ERROR_OUT_OF_MEMORY,))
    # no driver here to describe the code, so the message is the call and the code's name
    assert str(info.value) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"
    assert info.value.call == "cuMemAlloc"
    assert info.value.to_dict()["result"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_check_handles_nvrtc_results():
    with pytest.raises(D.CudaError, match="^nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION$"):
        D.check("nvrtcCompileProgram", (nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,))


def test_pipeline_refuses_a_host_array_larger_than_its_buffer():
    small, big = SimpleNamespace(nbytes=16), SimpleNamespace(nbytes=32)
    with pytest.raises(ValueError, match="32-byte host array does not fit a 16-byte device buffer"):
        G.TimedPipeline([(small, big)], lambda stream: None, [])  # before any CUDA call
    with pytest.raises(ValueError, match="does not fit"):
        G.TimedPipeline([], lambda stream: None, [(big, small)])


# --------------------------------------------------------------------------- TensorRT dtypes and IO tensors


@pytest.mark.parametrize(
    ("trt_type", "np_type"),
    [
        (trt.DataType.FLOAT, np.float32),
        (trt.DataType.HALF, np.float16),
        (trt.DataType.INT8, np.int8),
        (trt.DataType.INT32, np.int32),
        (trt.DataType.INT64, np.int64),
        (trt.DataType.BOOL, np.bool_),
        (trt.DataType.UINT8, np.uint8),
    ],
)
def test_numpy_dtype_maps_tensorrt_types(trt_type, np_type):
    assert R.numpy_dtype(trt, trt_type) == np.dtype(np_type)


@pytest.mark.parametrize("trt_type", [trt.DataType.BF16, trt.DataType.FP8, trt.DataType.INT4])
def test_numpy_dtype_refuses_types_numpy_lacks(trt_type):
    with pytest.raises(BuildFailed, match=f"data type {trt_type.name}, which has no numpy equivalent"):
        R.numpy_dtype(trt, trt_type)


def test_io_tensors_reads_names_directions_and_dtypes():
    io = {
        "images": (trt.TensorIOMode.INPUT, trt.DataType.HALF),
        "mask": (trt.TensorIOMode.INPUT, trt.DataType.BOOL),
        "logits": (trt.TensorIOMode.OUTPUT, trt.DataType.FLOAT),
    }
    names = list(io)
    engine = SimpleNamespace(
        num_io_tensors=len(io),
        get_tensor_name=names.__getitem__,
        get_tensor_mode=lambda n: io[n][0],
        get_tensor_dtype=lambda n: io[n][1],
    )
    assert R.io_tensors(engine, trt) == [
        R.TensorSpec("images", True, np.dtype(np.float16)),
        R.TensorSpec("mask", True, np.dtype(np.bool_)),
        R.TensorSpec("logits", False, np.dtype(np.float32)),
    ]


# --------------------------------------------------------------------------- clocks via NVML


def test_gpu_clocks_without_nvml_library_returns_an_error():
    clocks = G.gpu_clocks(0)  # this machine has pynvml but no libnvidia-ml
    assert set(clocks) == {"error"} and clocks["error"].startswith("NVML: ")


def test_gpu_clocks_without_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    clocks = G.gpu_clocks(pci_bus_id="0000:01:00.0")
    assert set(clocks) == {"error"} and clocks["error"].startswith("pynvml not importable (")


class FakeNvml(SimpleNamespace):
    """A GPU that reports clocks but, like many VMs, neither temperature nor power."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_GRAPHICS, NVML_TEMPERATURE_GPU = 1, 2, 0, 0
    current = {1: 1980, 2: 3201, 0: 1980}
    maximum = {1: 1980, 2: 3201, 0: 1980}

    def __init__(self) -> None:
        super().__init__(calls=[])

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> str:
        return f"pci:{bus_id}"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"index:{index}"

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        self.calls.append(handle)
        return self.current[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:
        return self.maximum[clock]

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        raise RuntimeError("Not Supported")

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        raise RuntimeError("Not Supported")


def test_gpu_clocks_partial_readings(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    clocks = G.gpu_clocks(3, pci_bus_id="0000:19:00.0")
    assert {k: v for k, v in clocks.items() if k != "error"} == {
        "sm_mhz": 1980,
        "sm_max_mhz": 1980,
        "memory_mhz": 3201,
        "memory_max_mhz": 3201,
        "graphics_mhz": 1980,
        "graphics_max_mhz": 1980,
    }
    assert clocks["error"] == "temperature_c: Not Supported; power_w: Not Supported"
    assert "pci:0000:19:00.0" in fake.calls  # the bus id wins over the index
    assert fake.calls[0] == "init" and fake.calls[-1] == "shutdown"


def test_gpu_clocks_by_index_and_power_in_watts(monkeypatch):
    fake = FakeNvml()
    fake.nvmlDeviceGetTemperature = lambda handle, sensor: 41
    fake.nvmlDeviceGetPowerUsage = lambda handle: 254_500  # milliwatts
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    clocks = G.gpu_clocks(2)
    assert "index:2" in fake.calls and "error" not in clocks
    assert clocks["temperature_c"] == 41 and clocks["power_w"] == 254.5


def test_error_logger_keeps_the_last_errors_for_our_messages():
    logger = R._error_logger(trt)
    assert isinstance(logger, trt.ILogger)
    logger.log(trt.ILogger.Severity.WARNING, "a warning is not an error")
    for i in range(7):
        logger.log(trt.ILogger.Severity.ERROR, f"error {i}")
    logger.log(trt.ILogger.Severity.INTERNAL_ERROR, "internal")
    assert logger.errors == ["error 3", "error 4", "error 5", "error 6", "internal"]
