"""The ONNX Runtime CUDA target's CPU-side logic: what the TF32 verdict decides, and that a worker without a GPU
refuses the target instead of building something else. The GPU itself is exercised by test_ort_cuda_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.core.domain import Target
from enginefarm.core.errors import TargetUnavailable
from enginefarm.core.probe.machineprobe import probe_machine
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import sample_spec, save_conv_net
from worker.backends.base import BuildLog
from worker.measure import evaluate as stage
from worker.pipeline import engine_from_model

CUDA = Target.parse("onnxruntime/cuda-sm90")


class Perturbed(stage.OrtRunner):
    """The CPU session with a relative error added to every output, as a reduced-precision matmul would leave;
    ``without_tf32`` gives the runner for the same model with ``exact_error`` instead (0: the exact CPU result)."""

    def __init__(self, model, error: float, exact_error: float = 0.0):
        super().__init__(model)
        self.error, self.exact_error, self.model = error, exact_error, model

    def infer(self, inputs):
        rng = np.random.default_rng(0)
        return {
            k: v * (1 + self.error * rng.standard_normal(v.shape)).astype(v.dtype)
            for k, v in super().infer(inputs).items()
        }

    def without_tf32(self):
        return Perturbed(self.model, self.exact_error)


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    work = tmp_path_factory.mktemp("tf32")
    model = save_conv_net(work / "m.onnx", seed=7)
    return model, inspect_upload(model, work / "inspect").info


def test_fp32_differences_that_go_away_without_tf32_pass_and_say_so(conv):
    model, info = conv
    spec = BuildSpec(**sample_spec())
    verdict = stage.check_accuracy(Perturbed(model, 1e-3), model, spec, info, None)
    assert verdict["pass"] and verdict["explained_by"] == "tf32" and verdict["failures"] == {}
    assert verdict["tf32"]["explains"] and verdict["tf32"]["pass_without_tf32"]
    assert verdict["tf32"]["failures_with_tf32"]  # what the fp32 limits said, kept
    assert "TF32's" in verdict["tf32"]["note"]


def test_an_error_that_stays_without_tf32_fails(conv):
    model, info = conv
    verdict = stage.check_accuracy(
        Perturbed(model, 1e-3, exact_error=1e-2), model, BuildSpec(**sample_spec()), info, None
    )
    assert not verdict["pass"] and verdict["tf32"]["explains"] is False and verdict["failures"]


def test_only_fp32_is_explained_by_tf32(conv):
    model, info = conv
    spec = BuildSpec(**sample_spec(), precision="fp16", accuracy={"tolerances": {"atol": 1e-6, "rtol": 1e-6}})
    verdict = stage.check_accuracy(Perturbed(model, 1e-3), model, spec, info, None)
    assert not verdict["pass"] and "tf32" not in verdict


def test_a_runner_within_fp32_limits_is_not_run_again(conv):
    model, info = conv

    class Exact(stage.OrtRunner):
        def without_tf32(self):
            raise AssertionError("a passing fp32 result needs no second run")

    verdict = stage.check_accuracy(Exact(model), model, BuildSpec(**sample_spec()), info, None)
    assert verdict["pass"] and "explained_by" not in verdict


def test_a_worker_without_a_gpu_refuses_the_cuda_target(conv, tmp_path):
    model, _ = conv
    probe = probe_machine()
    assert not probe.ort_cuda
    with pytest.raises(TargetUnavailable, match="onnxruntime/cuda-sm90: ONNX Runtime's CUDA provider is not usable"):
        engine_from_model(model, BuildSpec(**sample_spec()), CUDA, probe, tmp_path, BuildLog())


def test_tf32_is_hashed_only_when_turned_off():
    on, off = BuildSpec(**sample_spec()), BuildSpec(**sample_spec(), tf32=False)
    assert "tf32" not in on.canonical() and off.canonical()["tf32"] is False
    assert on.spec_hash() != off.spec_hash()
