"""The benchmark stage when a part of it fails: the reason is kept, the rest still runs, the build says so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from api.schemas.builds import build_summary
from enginefarm.core.domain import Target
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import sample_spec, save_conv_net
from worker.backends.base import BuildLog
from worker.measure import evaluate as stage
from worker.pipeline import engine_from_model

CPU = "onnxruntime/cpu-x86_64"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("evaluate")
    model = save_conv_net(work / "m.onnx", seed=5)
    spec = BuildSpec(
        **sample_spec(), benchmark={"warmup_ms": 0, "duration_s": 0.05, "iterations": 2, "batch_sizes": [1, 4]}
    )
    engine = engine_from_model(model, spec, Target.parse(CPU), None, work, BuildLog())
    return model, spec, inspect_upload(model, work / "inspect").info, engine.path


def test_a_shape_that_fails_is_reported_and_accuracy_still_runs(built, monkeypatch):
    """Was broken: the first benchmark failure ended the stage, the accuracy check never ran, and the check read
    as a plain success."""
    model, spec, info, engine = built
    real = stage.OrtRunner.benchmark

    def fails_at_batch_4(self, inputs, bench):
        if next(iter(inputs.values())).shape[0] == 4:
            raise RuntimeError("out of memory at batch 4")
        return real(self, inputs, bench)

    monkeypatch.setattr(stage.OrtRunner, "benchmark", fails_at_batch_4)
    result = stage.evaluate(engine, "onnxruntime", spec, info, model, None)
    assert [b.shape.key for b in result.benchmarks] == ["batch=1"]
    assert result.benchmarks[0].stats["inputs"] == "generated values within each input's range"
    (error,) = result.errors
    assert error.startswith("benchmark at batch=4 (input:4x3x32x32, generated values") and "out of memory" in error
    assert result.accuracy is not None and result.accuracy["pass"] is True


def test_time_limits_are_not_swallowed(built, monkeypatch):
    model, spec, info, engine = built

    class TimeUp(Exception):
        pass

    def too_slow(self, inputs, bench):
        raise TimeUp()

    monkeypatch.setattr(stage.OrtRunner, "benchmark", too_slow)
    with pytest.raises(TimeUp):
        stage.evaluate(engine, "onnxruntime", spec, info, model, None, reraise=(TimeUp,))


def test_build_summary_counts_checks_by_outcome():
    tasks = [SimpleNamespace(id=i, state=s) for i, s in enumerate(["succeeded", "succeeded", "succeeded", "failed"])]
    checks = {
        0: {"state": "succeeded", "accuracy_pass": True},
        1: {"state": "succeeded", "accuracy_pass": False},
        2: {"state": "failed", "accuracy_pass": None},
    }
    assert build_summary(tasks, checks) == (
        "3 of 4 targets built, 1 failed; checks: 1 passed, 1 accuracy failed, 1 check failed"
    )
    assert (
        build_summary(tasks[:1], {0: {"state": "pending", "accuracy_pass": None}})
        == "1 of 1 targets built; checks: 1 pending"
    )
