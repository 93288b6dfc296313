"""int8 accuracy repair: the sensitivity ranking by ONNX node name, the search for the layers kept in float, the
budget stop, and that the same inputs give the same answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import save_conv_net
from enginefarm.measure.ort_runner import OrtRunner
from tests.unit.worker.test_int8_vs_fp32 import _wide_add
from worker.int8 import repair as R


def _runner(path: Path) -> OrtRunner:
    return OrtRunner(path, threads=1)


def _inputs(tmp_path: Path):
    source = _wide_add(tmp_path / "m.onnx")
    x = np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 16, 16]}, accuracy_repair=True)
    return source, {"input": x}, spec, inspect_upload(source, tmp_path / "inspect").info


def test_sensitivity_ranks_the_layer_whose_range_int8_cannot_hold_first(tmp_path: Path):
    source, samples, spec, info = _inputs(tmp_path)
    ranking = R.sensitivity(source, samples, spec, info, tmp_path)
    # A tensor stays float when its producer (if quantized) and its quantized readers are excluded; the Add's
    # output, or its input (whose readers include the Add), then fixes the output. Nothing without the Add does.
    assert "shift" in ranking[0]["layers"] and ranking[0]["cosine_int8"] < 0.98 < ranking[0]["cosine_alone_float"]
    assert {"shifted", "r"} >= {r["tensor"] for r in ranking if r["cosine_alone_float"] >= 0.98}, ranking
    others = [r for r in ranking if "shift" not in r["layers"]]
    assert others and all(r["cosine_alone_float"] < 0.98 for r in others), ranking


def test_repair_keeps_exactly_the_sensitive_layer_and_the_artifact_passes(tmp_path: Path):
    source, samples, spec, info = _inputs(tmp_path)
    report = R.repair(source, samples, spec, info, tmp_path, _runner)
    assert report["needed"] is True and report["before"]["pass"] is False and report["before"]["cosine"] < 0.98
    assert report["passed"] is True and report["kept"] == ["shift"], report
    assert report["after"]["pass"] is True and report["after"]["cosine"] > 0.99
    assert "shift" in report["ranking"][0]["layers"] and report["evaluations"] == 2  # before, and the set found
    # The cost in checks of the model: the repair's seconds over those of its first check.
    assert 0 < report["check_seconds"] < report["seconds"]
    # (both figures are rounded in the report, the ratio is of the unrounded ones)
    assert report["cost_in_checks"] == pytest.approx(report["seconds"] / report["check_seconds"], rel=0.1)
    assert report["cost_in_checks"] >= 2  # two real checks at least: the median is at most half the repair
    assert report["probe_evaluations"] >= len(report["ranking"])
    assert list(tmp_path.glob("int8-repair-*")) == []
    again = R.repair(source, samples, spec, info, tmp_path, _runner)  # the same samples and spec: the same answer
    assert again["kept"] == report["kept"] and again["ranking"] == report["ranking"]


def test_repair_is_not_needed_when_the_gate_already_passes(tmp_path: Path):
    source = save_conv_net(tmp_path / "conv.onnx", seed=2)
    x = np.random.default_rng(2).standard_normal((8, 3, 32, 32)).astype(np.float32)
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 32, 32]}, accuracy_repair=True)
    report = R.repair(source, {"input": x}, spec, inspect_upload(source, tmp_path / "i").info, tmp_path, _runner)
    assert report["needed"] is False and report["passed"] is True and report["kept"] == []
    assert report["evaluations"] == 1 and "ranking" not in report


def test_repair_stops_honestly_when_no_set_within_the_budget_passes(tmp_path: Path):
    source, samples, spec, info = _inputs(tmp_path)
    # A cosine no int8 artifact of this model reaches while any layer stays int8, and a budget of one layer.
    strict = spec.model_copy(update={"accuracy": spec.accuracy.model_copy(update={"tolerances": {"cosine": 1.0}})})
    report = R.repair(source, samples, strict, info, tmp_path, _runner)
    assert report["passed"] is False and report["kept"] == [] and report["budget"] >= 1
    assert report["note"].startswith(f"no set of up to {report['budget']} of the ")
    assert "build fp16 for this model" in report["note"]
    # Every other form was judged too, and none passes such a gate; the note gives their figures.
    assert report["forms"] and not any(f["pass"] for f in report["forms"].values()) and "form" not in report
    assert all(f"the {name} form" in report["note"] for name in report["forms"])


def test_repair_passes_with_a_form_when_no_set_within_the_budget_does(tmp_path: Path):
    source = _wide_add(tmp_path / "m.onnx", shifts=4)
    x = np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 16, 16]}, accuracy_repair=True)
    report = R.repair(source, {"input": x}, spec, inspect_upload(source, tmp_path / "i").info, tmp_path, _runner)
    assert report["needed"] is True and report["before"]["pass"] is False
    # Four shifts need four layers in float; the budget (a quarter of the quantized layers) holds fewer.
    assert report["budget"] < 4 and report["kept"] == []
    assert report["passed"] is True and report["form"] == "convolutions", report
    assert report["forms"]["convolutions"]["pass"] is True and report["after"] == report["forms"]["convolutions"]
    assert report["note"].startswith(f"no set of up to {report['budget']} of the ")
    assert "the convolutions form passes as it is" in report["note"] and "build fp16" not in report["note"]
