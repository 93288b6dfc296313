"""The fp16 repair judged on the GPU: an overflow the CPU's fp16 artifact hides, found and mended on ONNX Runtime's
CUDA provider.

Marked ``gpu``: deselected where no NVIDIA GPU with onnxruntime-gpu is found (tests/gpumark.py); bench/gpu_matrix.sh
runs them on the GPU machine (``bench/gpu_matrix.sh test tests/e2e/worker/test_fp16_repair_gpu.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from enginefarm.core.domain import Target, arch_of_cc
from enginefarm.core.probe.machineprobe import probe_machine
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.measure.ort_cuda_runner import OrtCudaRunner
from enginefarm.measure.ort_runner import OrtRunner
from tests.unit.worker.test_fp16_repair import SHAPES, hidden_overflow_model, overflow_samples
from worker.backends.base import BuildLog
from worker.backends.onnxruntime_cuda import build_cuda
from worker.fp16 import repair as F
from worker.fp16.stage import judge_target, repair_on
from worker.measure.evaluate import check_accuracy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda() -> Target:
    return Target.parse(f"onnxruntime/cuda-{arch_of_cc(probe_machine().gpus[0].compute_capability)}")


def _gpu_check(source: Path, spec: BuildSpec, target: Target, out: Path) -> dict:
    """The CUDA artifact of ``source`` under ``spec``, judged by the benchmark stage's accuracy check on the GPU."""
    out.parent.mkdir(parents=True, exist_ok=True)
    build_cuda(source, spec, target, out, BuildLog(), None)
    runner = OrtCudaRunner(out, tf32=spec.tf32)
    try:
        info = inspect_upload(source, out.parent / "inspect").info
        return check_accuracy(runner, source, spec, info, {"input": overflow_samples()})
    finally:
        runner.close()


def test_the_gpu_judge_finds_the_overflow_the_cpu_misses_and_the_repaired_engine_passes(tmp_path: Path, cuda):
    source = hidden_overflow_model(tmp_path / "hidden.onnx")
    spec = BuildSpec(precision="fp16", shapes=SHAPES, accuracy_repair=True)
    info = inspect_upload(source, tmp_path / "inspect").info
    samples = {"input": overflow_samples()}
    assert judge_target([Target.parse("onnxruntime/cpu-x86_64"), cuda]) == cuda  # this worker judges on its GPU

    on_cpu = F.repair(source, source, samples, spec, info, tmp_path, lambda p: OrtRunner(p, threads=1))
    assert on_cpu["needed"] is False  # the CPU's fp16 artifact passes: the square is never an fp16 tensor there
    plain = _gpu_check(source, spec, cuda, tmp_path / "plain" / "m.onnx")
    assert plain["pass"] is False, plain  # the GPU's fp16 Mul overflows

    report = repair_on(source, source, samples, spec, info, tmp_path, cuda)
    assert report["judged_on"] == str(cuda) and "CUDA provider" in report["measured_on"], report
    assert report["needed"] is True and report["before"]["pass"] is False
    assert report["passed"] is True and report["kept"] == ["square"], report
    assert report["ranking"][0]["layers"] == ["square"] and report["ranking"][0]["pass_alone"]
    assert f"measured on the {cuda} artifact" in report["method"]

    repaired = spec.model_copy(update={"keep_fp32_layers": report["kept"]})
    mended = _gpu_check(source, repaired, cuda, tmp_path / "repaired" / "m.onnx")
    assert mended["pass"] is True, mended
