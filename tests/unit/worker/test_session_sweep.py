"""The session sweep of an onnxruntime/cuda artifact (worker/measure/sessions.py) and the options it hands on.

The GPU is exercised by bench/gpu_matrix.py on a borrowed one; here the sweep's choice is driven by runners whose
timings and outputs the test sets: each one is the real ONNX Runtime CPU session of a conv net, with its
measurement's median replaced and, for NHWC, its outputs moved as other kernels could move them."""

from __future__ import annotations

import pytest

from enginefarm.core.spec import BuildSpec
from enginefarm.core.stats import Iteration, Measurement
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import sample_spec, save_conv_net
from enginefarm.measure.ort_cuda_runner import SESSION_CHOICES, SessionChoice
from enginefarm.measure.ort_runner import OrtRunner
from worker.measure import evaluate, sessions

DEFAULTS = SessionChoice()


def fake_runners(medians: dict[str, float], nhwc_error: float = 0.0, broken: frozenset[str] = frozenset()):
    """An OrtCudaRunner stand-in: ``medians`` per choice's name; NHWC outputs off by ``nhwc_error`` (relative);
    the choices in ``broken`` fail to load, as a provider refusing an option does."""
    made: list[SessionChoice] = []

    class Runner(OrtRunner):
        def __init__(self, path, tf32=True, device_index=0, choice=DEFAULTS):
            if choice.name in broken:
                from enginefarm.core.errors import BuildFailed

                raise BuildFailed(f"{choice.name}: not supported here")
            super().__init__(path)
            self.choice = choice
            made.append(choice)

        def infer(self, inputs):
            out = super().infer(inputs)
            if self.choice.nhwc and nhwc_error:
                out = {k: v * (1 + nhwc_error) for k, v in out.items()}
            return out

        def benchmark(self, inputs, spec):
            ms = medians[self.choice.name]
            timed = [Iteration(e2e=ms, compute=ms * 0.9)] * 10
            return Measurement(timed, wall_s=ms / 100, warmup_iterations=1, warmup_s=0.0)

    return Runner, made


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    work = tmp_path_factory.mktemp("sweep")
    model = save_conv_net(work / "m.onnx", seed=3)
    info = inspect_upload(model, work / "inspect").info
    spec = BuildSpec(**sample_spec())
    reference = evaluate.accuracy_inputs(model, spec, info, None)
    inputs = reference.feeds[0]
    return model, spec, reference, inputs


def test_the_fastest_choice_whose_outputs_pass_is_kept(conv, monkeypatch):
    model, spec, reference, inputs = conv
    runner, _ = fake_runners({"default": 2.0, "nhwc": 1.5, "cuda-graph": 1.2, "nhwc+cuda-graph": 0.9})
    monkeypatch.setattr(sessions, "OrtCudaRunner", runner)
    swept = sessions.sweep(model, spec, inputs, reference)
    assert swept.chosen == SessionChoice(nhwc=True, cuda_graph=True)
    assert swept.chosen.provider_options() == {"prefer_nhwc": "1", "enable_cuda_graph": "1"}
    record = swept.record()
    assert record["chosen"] == "nhwc+cuda-graph"
    assert [c["session"] for c in record["choices"]] == [c.name for c in SESSION_CHOICES]
    assert {c["session"]: c["median_ms"] for c in record["choices"]}["default"] == pytest.approx(2.0)
    assert record["choices"][-1]["accuracy_pass"] is True
    assert record["seconds"] > 0  # what the sweep cost is kept with it


def test_nhwc_whose_outputs_fail_the_check_is_passed_over_for_the_graph_of_the_default_kernels(conv, monkeypatch):
    model, spec, reference, inputs = conv
    runner, _ = fake_runners({"default": 2.0, "nhwc": 1.0, "cuda-graph": 1.4, "nhwc+cuda-graph": 0.8}, 0.5)
    monkeypatch.setattr(sessions, "OrtCudaRunner", runner)
    swept = sessions.sweep(model, spec, inputs, reference)
    assert swept.chosen == SessionChoice(cuda_graph=True)
    by = {c["session"]: c for c in swept.record()["choices"]}
    assert by["nhwc+cuda-graph"]["accuracy_pass"] is False and by["nhwc"]["accuracy_pass"] is False
    assert "accuracy_pass" not in by["cuda-graph"]  # the default kernels: the stage's own check judges them


def test_a_choice_the_provider_refuses_is_recorded_with_why_and_the_rest_still_compete(conv, monkeypatch):
    model, spec, reference, inputs = conv
    medians = {"default": 2.0, "nhwc": 1.9, "cuda-graph": 1.0, "nhwc+cuda-graph": 0.5}
    runner, _ = fake_runners(medians, broken=frozenset({"cuda-graph", "nhwc+cuda-graph"}))
    monkeypatch.setattr(sessions, "OrtCudaRunner", runner)
    swept = sessions.sweep(model, spec, inputs, reference)
    assert swept.chosen == SessionChoice(nhwc=True)
    by = {c["session"]: c for c in swept.record()["choices"]}
    assert by["cuda-graph"]["error"] == "cuda-graph: not supported here"
    assert "median_ms" not in by["nhwc+cuda-graph"]


def test_options_read_back_from_an_engines_record():
    for choice in SESSION_CHOICES:
        assert SessionChoice.of(choice.provider_options()) == choice
    assert SessionChoice.of(None) == SessionChoice()
    assert SessionChoice(nhwc=True, cuda_graph=True).plain() == SessionChoice(nhwc=True)
    assert [c.name for c in SESSION_CHOICES] == ["default", "nhwc", "cuda-graph", "nhwc+cuda-graph"]
