"""ONNX Runtime's CUDA target on a real GPU: probe, build, the farm's CUDA timing, accuracy and the TF32 verdict.

Marked ``gpu``: deselected where no NVIDIA GPU with onnxruntime-gpu is found (tests/gpumark.py); bench/gpu_matrix.sh
runs them on the GPU machine.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.compat import Match, judge
from enginefarm.core.domain import ModelInfo, Target, TensorInfo, arch_of_cc
from enginefarm.core.probe.machineprobe import machine_fingerprint, probe_machine
from enginefarm.core.probe.policy import buildable_targets
from enginefarm.core.spec import BenchmarkSpec, BuildSpec
from enginefarm.graph.samples import sample_spec, save_conv_net
from enginefarm.measure.ort_cuda_runner import OrtCudaRunner
from enginefarm.measure.ort_runner import OrtRunner
from worker.backends.base import BuildLog
from worker.backends.onnxruntime_cuda import build_cuda
from worker.measure.evaluate import check_accuracy, evaluate

pytestmark = pytest.mark.gpu
QUICK = BenchmarkSpec(warmup_ms=50, duration_s=0.3, iterations=10)


@pytest.fixture(scope="module")
def probe():
    return probe_machine()


@pytest.fixture(scope="module")
def target(probe) -> Target:
    return Target.parse(f"onnxruntime/cuda-{arch_of_cc(probe.gpus[0].compute_capability)}")


def test_the_probe_serves_the_cuda_target_and_the_fingerprint_says_so(probe, target):
    assert probe.ort_cuda and probe.ort_cuda_error is None
    assert target in buildable_targets(probe)
    machine = machine_fingerprint(probe)
    assert machine.ort_cuda and machine.ort_version == probe.modules["onnxruntime"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_build_benchmark_and_accuracy_on_the_gpu(probe, target, precision, tmp_path):
    model = save_conv_net(tmp_path / "m.onnx", seed=3)
    spec = BuildSpec(**sample_spec(), precision=precision, benchmark=QUICK.model_dump())
    out = tmp_path / "engine.plan"
    desc = build_cuda(model, spec, target, out, BuildLog(), probe)
    assert desc.target == str(target) and desc.gpu_name == probe.gpus[0].name
    assert desc.compute_capability == probe.gpus[0].compute_capability and desc.cuda_version
    assert judge(desc, machine_fingerprint(probe)).match is Match.EXACT_GPU
    onnx.checker.check_model(str(out))
    runner = OrtCudaRunner(out)
    try:
        x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
        m = runner.benchmark({"input": x}, QUICK)
        got = runner.infer({"input": x})
    finally:
        runner.close()
    s = m.summary(4)
    for phase in ("h2d", "compute", "d2h"):
        assert s[phase]["median"] > 0
    # One stream, four events: the phases add up to the end-to-end time within a few microseconds each.
    assert abs(s["h2d"]["median"] + s["compute"]["median"] + s["d2h"]["median"] - s["e2e"]["median"]) < 0.05
    assert s["gpu_memory_in_use_bytes"] > 0 and s["runtime"]["cudnn"] and s["runtime"]["session"]["provider_options"]
    cpu = OrtRunner(model)
    want = cpu.infer({"input": x})
    tol = 1e-2 if precision == "fp32" else 5e-2
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, atol=tol, rtol=tol)


def _matmul(path, weight: np.ndarray) -> None:
    """y = x @ W, K large enough that TF32's 10-bit mantissa shows beyond the fp32 limits."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", weight.shape[1]])],
        [numpy_helper.from_array(weight, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def _info(k: int, n: int) -> ModelInfo:
    return ModelInfo(
        inputs=[TensorInfo("x", "FLOAT", ["batch", k])],
        outputs=[TensorInfo("y", "FLOAT", ["batch", n])],
        opset=17,
        ir_version=8,
        producer="test",
        size=0,
    )


def test_tf32_differences_are_explained_and_real_ones_still_fail(tmp_path):
    k, n = 2048, 256
    weight = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    reference = tmp_path / "ref.onnx"
    _matmul(reference, weight)
    spec = BuildSpec(shapes={"x": [16, k]}, accuracy={"batches": 2})
    info = _info(k, n)
    runner = OrtCudaRunner(reference, tf32=True)
    try:
        verdict = check_accuracy(runner, reference, spec, info, None)
    finally:
        runner.close()
    assert verdict["pass"] and verdict["explained_by"] == "tf32", verdict
    assert verdict["tf32"]["worst_with_tf32"]["max_abs"] > 1e-3 > verdict["tf32"]["worst_without_tf32"]["max_abs"]
    # A real error (one weight changed) is not hidden behind TF32: it fails with TF32 off as well.
    broken = tmp_path / "broken.onnx"
    bad = weight.copy()
    bad[0, 0] += 1.0
    _matmul(broken, bad)
    runner = OrtCudaRunner(broken, tf32=True)
    try:
        verdict = check_accuracy(runner, reference, spec, info, None)
    finally:
        runner.close()
    assert not verdict["pass"] and verdict["tf32"]["explains"] is False


def test_evaluate_stores_the_gpu_figures(probe, target, tmp_path):
    model = save_conv_net(tmp_path / "m.onnx", seed=4)
    spec = BuildSpec(**sample_spec(), benchmark={**QUICK.model_dump(), "batch_sizes": [1, 8]})
    out = tmp_path / "engine.plan"
    build_cuda(model, spec, target, out, BuildLog(), probe)
    from enginefarm.graph.modelfile import inspect_upload

    info = inspect_upload(model, tmp_path / "inspect").info
    result = evaluate(out, "onnxruntime", spec, info, model, None, target=target)
    assert not result.errors, result.errors
    assert result.gpu_name == probe.gpus[0].name and [b.shape.batch for b in result.benchmarks] == [1, 8]
    assert result.accuracy["pass"] and result.device_memory_bytes
    assert all(b.stats["cuda_graph"] is False and b.stats["h2d"] for b in result.benchmarks)
