"""The failed original beside its repair, on the worker: the repair leaves the int8 model it judged before keeping
layers in fp32; the CPU candidates' run times it interleaved with fp32 and the candidates made with the kept layers;
the repair report gets the three latencies, and says so when the repaired int8 is not faster than fp32.

The model is the wide Add of test_int8_vs_fp32 (one layer whose range int8 cannot hold): a 16x16 image through one
small convolution, so int8's quantize and dequantize steps cost more than the arithmetic they save, and int8 is
slower than fp32 on any CPU (about 0.65x here), repaired or not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.measure.ort_runner import OrtRunner
from tests.unit.worker.test_int8_vs_fp32 import _wide_add
from worker.int8 import choice as C
from worker.int8 import repair as R
from worker.int8.choice import gate_figure
from worker.int8.variant import latency
from worker.measure.evaluate import accuracy_inputs, check_accuracy


def _runner(path: Path) -> OrtRunner:
    return OrtRunner(path, threads=1)


def test_the_repair_leaves_the_failed_original_and_it_is_timed_with_fp32_and_the_repaired_int8(tmp_path: Path):
    source = _wide_add(tmp_path / "m.onnx")
    samples = {"input": np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)}
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 16, 16]}, accuracy_repair=True)
    info = inspect_upload(source, tmp_path / "inspect").info
    report = R.repair(source, samples, spec, info, tmp_path, _runner, unrepaired_to=tmp_path / "unrepaired")
    assert report["kept"] == ["shift"] and report["before"]["pass"] is False
    original = tmp_path / "unrepaired" / "model.int8.onnx"
    # The failed original: the Add quantized (the repair's recipe, the operator format), as the repair judged it.
    assert "QLinearAdd" in {n.op_type for n in onnx.load(str(original)).graph.node}
    assert json.loads((tmp_path / "unrepaired" / "report.json").read_text())["options"]["recipe"] == "operator"

    repaired_spec = spec.model_copy(update={"keep_fp32_layers": report["kept"]})
    out = tmp_path / "model.int8.onnx"
    cpu, timed = C.quantize_for_cpu_beside(
        source, samples, out, repaired_spec, info, tmp_path, _runner, {"unrepaired": original}, source
    )
    # Beside the candidates, never one of them: the stored model is a candidate with the Add in float.
    assert [c["name"] for c in cpu.candidates] == ["operator", "convolutions"] and out.exists()
    assert "QLinearAdd" not in {n.op_type for n in onnx.load(str(out)).graph.node}
    before = timed["unrepaired"]
    assert before["pass"] is False and before["cosine"] == report["before"]["cosine"], (before, report["before"])
    # fp32 timed once for all: the unrepaired model's figure has the same fp32 median as the kept candidate's.
    assert before["vs_fp32"]["fp32_median_ms"] == cpu.vs_fp32["fp32_median_ms"]

    figures = latency(cpu.to_dict(), timed, kept_anything=True)
    lat, speedup = figures["latency_ms"], figures["speedup"]
    assert lat["fp32"] > 0 and lat["unrepaired"] > 0 and lat["repaired"] > 0, figures
    for k in ("unrepaired", "repaired"):  # fp32's median over each int8's (medians rounded to 0.1 µs)
        assert abs(lat["fp32"] / lat[k] - speedup[k]) <= 0.02 * speedup[k] + 0.01, figures
    kept = next(c for c in cpu.candidates if c["kept"])
    assert speedup["repaired"] == kept["speedup"] and f"candidate {kept['name']}" in figures["latency_where"]
    print(f"\nwide Add, CPU median ms: {lat}, speed-ups {speedup}")
    # The honest stop: int8 is slower here, and the report says so with the figures and recommends fp32.
    assert speedup["repaired"] < 1.0 and figures["faster_than_fp32"] is False, figures
    assert figures["recommend"] == "fp32"
    note = figures["speed_note"]
    assert note.startswith("the repaired int8 is not faster than fp32 on this CPU: ") and "build fp32" in note
    assert f"({speedup['repaired']:.2f}x; int8 without the repair " in note, note


def test_the_failed_original_is_left_only_when_the_repair_keeps_layers(tmp_path: Path):
    source = _wide_add(tmp_path / "m.onnx")
    samples = {"input": np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)}
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 16, 16]}, accuracy_repair=True)
    info = inspect_upload(source, tmp_path / "inspect").info
    # Nothing within the budget passes a cosine of 1.0: nothing is kept, the model as built is the original itself.
    strict = spec.model_copy(update={"accuracy": spec.accuracy.model_copy(update={"tolerances": {"cosine": 1.0}})})
    report = R.repair(source, samples, strict, info, tmp_path, _runner, unrepaired_to=tmp_path / "unrepaired")
    assert report["passed"] is False and report["kept"] == []
    assert not (tmp_path / "unrepaired").exists()
    # The original judged as the artifact it is: its cosine is the repair's before.
    report = R.repair(source, samples, spec, info, tmp_path, _runner, unrepaired_to=tmp_path / "unrepaired")
    original = _runner(tmp_path / "unrepaired" / "model.int8.onnx")
    try:
        judged = gate_figure(original, accuracy_inputs(source, spec, info, samples), spec.accuracy.limits("int8"))
    finally:
        original.close()
    assert judged["pass"] is False and judged["cosine"] == report["before"]["cosine"], judged


def test_the_int8_stage_and_the_engines_check_judge_the_kept_artifact_alike(tmp_path: Path):
    """The stage's figure of the candidate it keeps, and of the repair's before and after, are the figures the
    engine's accuracy check then measures for that artifact: the same inputs (all the samples, at the opt batch),
    the same reference, the same code. (They once judged on the first two samples only, and said 0.889 where
    the check said 0.935.)"""
    source = _wide_add(tmp_path / "m.onnx")
    samples = {"input": np.random.default_rng(5).standard_normal((12, 3, 16, 16)).astype(np.float32)}
    spec = BuildSpec(
        precision="int8",
        profiles=[{"input": {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [4, 3, 16, 16]}}],
        accuracy_repair=True,
    )
    info = inspect_upload(source, tmp_path / "inspect").info
    report = R.repair(source, samples, spec, info, tmp_path, _runner, unrepaired_to=tmp_path / "unrepaired")
    assert report["kept"], report  # the wide Add is kept in float, so there is a before and an after
    repaired = spec.model_copy(update={"keep_fp32_layers": report["kept"]})
    out = tmp_path / "stored" / "model.int8.onnx"
    out.parent.mkdir()
    cpu = C.quantize_for_cpu(source, samples, out, repaired, info, tmp_path, _runner, source)
    kept = next(c for c in cpu.candidates if c["kept"])
    assert kept["judged_on"] == "12 user samples in 3 batch(es)", kept
    for model, figure in ((out, kept), (tmp_path / "unrepaired" / "model.int8.onnx", report["before"])):
        runner = _runner(model)
        try:
            checked = check_accuracy(runner, source, repaired, info, samples)
        finally:
            runner.close()
        assert round(checked["worst"]["cosine"], 6) == figure["cosine"], (checked["worst"], figure)
        assert checked["pass"] is figure["pass"]


def test_the_speed_stop_follows_the_candidates_rule():
    def cpu(fp32: float, int8: float) -> dict:
        s = round(fp32 / int8, 3)
        vs = {"fp32_median_ms": fp32, "int8_median_ms": int8, "speedup": s}
        return {"vs_fp32": vs, "candidates": [{"name": "operator", "kept": True, "speedup": s}]}

    def unrepaired(fp32: float, int8: float) -> dict:
        return {"unrepaired": {"vs_fp32": {"fp32_median_ms": fp32, "int8_median_ms": int8, "speedup": fp32 / int8}}}

    faster = latency(cpu(10.0, 4.0), unrepaired(10.0, 3.5), kept_anything=True)
    assert faster["faster_than_fp32"] is True and "speed_note" not in faster and "recommend" not in faster
    assert faster["latency_ms"] == {"fp32": 10.0, "unrepaired": 3.5, "repaired": 4.0}
    tie = latency(cpu(10.0, 10.0), unrepaired(10.0, 8.0), kept_anything=True)  # 1.00x is not faster
    assert tie["faster_than_fp32"] is False and tie["recommend"] == "fp32", tie
    # Nothing kept: the model as built is int8 without repair; no repaired figure, no speed stop of the repair.
    plain = latency(cpu(10.0, 12.0), {}, kept_anything=False)
    assert plain["latency_ms"] == {"fp32": 10.0, "unrepaired": 12.0, "repaired": None} and "speed_note" not in plain
    # A build without a CPU target: the original is kept, not timed, and the report says why.
    assert latency(None, {}, kept_anything=True)["latency_note"].startswith("not timed: the build has no ONNX")
