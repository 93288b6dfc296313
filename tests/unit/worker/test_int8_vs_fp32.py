"""The int8-against-fp32 figure: interleaved blocks, both medians, and the not-faster mark with its figure. No
timing is asserted here (bench/models.py measures); only what gets recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.spec import BuildSpec
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import save_conv_net
from enginefarm.measure.ort_runner import OrtRunner
from worker.int8 import choice as C
from worker.int8.quantize import cpu_candidates
from worker.measure import int8_vs_fp32 as V


def test_interleaved_alternates_the_order_and_times_both():
    calls: list[str] = []
    a, b = V.interleaved_all([lambda: calls.append("a"), lambda: calls.append("b")], rounds=4, block_s=0.0)
    assert len(a) == len(b) == 4  # one call per block here, after one warm-up call each
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert all(t >= 0 for t in a + b)


def test_verdict_marks_an_int8_that_is_not_faster_with_the_figure():
    slower = V.verdict([12.0, 11.0, 13.0], [10.0, 9.0, 11.0])
    assert slower["faster"] is False and slower["speedup"] == round(10 / 12, 3)
    assert slower["fp32_median_ms"] == 10.0 and slower["int8_median_ms"] == 12.0
    assert slower["note"] == "int8 is not faster than fp32 here: 12.00 ms against 10.00 ms (0.83x)"
    faster = V.verdict([4.0, 5.0], [10.0, 10.0])
    assert faster["faster"] is True and faster["speedup"] == round(10 / 4.5, 3) and "note" not in faster


def test_interleaved_all_takes_every_run_in_turn_and_reverses_the_order_every_other_round():
    calls: list[str] = []
    times = V.interleaved_all([lambda k=k: calls.append(k) for k in "abc"], rounds=2, block_s=0.0)
    assert calls == ["a", "b", "c", "a", "b", "c", "c", "b", "a"]
    assert [len(t) for t in times] == [2, 2, 2]


def _figure(name: str, speedup: float, ok: bool = True, cosine: float = 0.999) -> dict:
    return {"name": name, "pass": ok, "speedup": speedup, "cosine": cosine}


def test_pick_keeps_the_fastest_candidate_that_passed_the_gate():
    name, why = C.pick([_figure("operator", 0.6), _figure("convolutions", 2.0, ok=False), _figure("dynamic", 1.3)])
    assert name == "dynamic"  # the faster convolutions candidate failed the gate
    assert why == "fastest that passed the int8 gate: 1.30x fp32 (operator 0.60x)"


def test_pick_prefers_the_earlier_candidate_when_two_measure_alike():
    assert C.pick([_figure("operator", 1.50), _figure("dynamic", 1.52)])[0] == "operator"  # within SAME_SPEED
    assert C.pick([_figure("operator", 1.40), _figure("dynamic", 1.52)])[0] == "dynamic"


def test_interleaved_rounds_keeps_each_rounds_block_apart():
    calls: list[str] = []
    by_round = V.interleaved_rounds([lambda k=k: calls.append(k) for k in "ab"], rounds=3, block_s=0.0)
    assert [len(blocks) for blocks in by_round] == [3, 3]  # per run, one block per round
    assert all(len(block) == 1 and block[0] >= 0 for blocks in by_round for block in blocks)


def test_pick_takes_a_much_faster_form_that_wins_most_rounds():
    """PP-OCR rec's candidates as timed on a 16-vCPU Xeon: dynamic is faster in 4 of 6 rounds by a median of 1.27x
    (one disturbed round, 0.51x); the dense-convolution form it lost to before was 0.73x fp32 against its 0.96x."""
    dense = {**_figure("dense-convolutions", 0.728), "round_speedups": [0.74, 0.626, 0.759, 0.559, 0.771, 0.721]}
    dynamic = {**_figure("dynamic", 0.962), "round_speedups": [0.703, 0.916, 1.018, 0.508, 0.984, 0.907]}
    name, why = C.pick([dense, dynamic])
    assert name == "dynamic" and why.startswith("fastest that passed the int8 gate: 0.96x fp32"), why
    # Half the rounds is not most of them, however wide the margin.
    half = {**dynamic, "round_speedups": [0.703, 0.916, 1.018, 0.508, 0.984, 0.5]}
    assert C.pick([dense, half])[0] == "dense-convolutions"


def test_each_block_starts_after_an_untimed_pause(monkeypatch):
    """The pause lets the previous session's spinning pool threads park before the next block is timed."""
    events: list[str] = []
    monkeypatch.setattr(V.time, "sleep", lambda s: events.append(f"sleep {s}"))
    V.interleaved_rounds([lambda k=k: events.append(k) for k in "ab"], rounds=2, block_s=0.0)
    pause = f"sleep {V.SETTLE_S}"
    assert events == ["a", "b", pause, "a", pause, "b", pause, "b", pause, "a"]  # warm-ups, then every block
    assert V.SETTLE_S >= 0.1  # shorter pauses left the timings disturbed (docs/int8.md)


def test_pick_keeps_the_earlier_candidate_unless_the_faster_one_wins_round_after_round():
    """A faster median that is not faster in nearly every round is this CPU's noise: the earlier candidate stays,
    so the same model gets the same form build after build (a 2-core machine shared with other work moved BERT's
    kept form between builds)."""
    noisy = {**_figure("dynamic", 1.60), "round_speedups": [1.7, 1.4, 1.7, 1.4, 1.7, 1.45]}
    steady = {**_figure("operator", 1.50), "round_speedups": [1.5, 1.5, 1.5, 1.5, 1.5, 1.5]}
    name, why = C.pick([steady, noisy])
    assert name == "operator" and "dynamic 1.60x is not faster in enough rounds" in why
    clear = {**_figure("dynamic", 1.60), "round_speedups": [1.6, 1.6, 1.7, 1.4, 1.6, 1.6]}  # 5 of 6 rounds
    assert C.pick([steady, clear])[0] == "dynamic"


def test_pick_says_when_no_candidate_is_faster_or_none_passes():
    name, why = C.pick([_figure("operator", 0.7), _figure("convolutions", 0.8)])
    assert name == "convolutions" and why.endswith("no candidate is faster than fp32 on this CPU")
    name, why = C.pick(
        [
            _figure("operator", 1.5, ok=False, cosine=0.93),
            _figure("dynamic", 1.1, ok=False, cosine=0.95),
            {"name": "convolutions", "error": "did not quantize"},
        ]
    )
    assert name == "dynamic" and why == "no candidate passed the int8 gate; kept the most accurate (cosine 0.9500)"
    assert C.pick([{"name": "operator", "error": "x"}]) == (None, "no candidate quantized")


def _mlp(path: Path, width: int = 64, seed: int = 0) -> Path:
    """Three matrix products with constant weights and no convolution: what dynamic quantization is for."""
    rng = np.random.default_rng(seed)
    inits, nodes, prev = [], [], "input"
    for i in range(3):
        w = (rng.standard_normal((width, width)) / width**0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"fc{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev = f"r{i}"
    nodes[-1] = helper.make_node("Identity", ["m2"], ["output"], name="out")
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_cpu_candidates_are_the_recipes_that_differ_on_the_model(tmp_path: Path):
    assert cpu_candidates(save_conv_net(tmp_path / "conv.onnx")) == ["operator", "convolutions"]  # one MatMul head
    assert cpu_candidates(_mlp(tmp_path / "mlp.onnx")) == ["operator", "dynamic"]


def _opened(paths: list[Path]):
    def runner(path: Path) -> OrtRunner:
        paths.append(path)
        return OrtRunner(path, threads=1)

    return runner


def test_quantize_for_cpu_measures_each_candidate_and_keeps_the_one_pick_chooses(tmp_path: Path):
    source = _mlp(tmp_path / "mlp.onnx", seed=4)
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    spec = BuildSpec(precision="int8", shapes={"input": [1, 64]})
    info = inspect_upload(source, tmp_path / "inspect").info
    opened: list[Path] = []
    out = tmp_path / "out" / "model.int8.onnx"
    out.parent.mkdir()
    report = C.quantize_for_cpu(source, {"input": x}, out, spec, info, tmp_path, _opened(opened))
    assert [p.name for p in opened] == ["fp32.onnx", "operator.onnx", "dynamic.onnx"]
    names = [c["name"] for c in report.candidates]
    assert names == ["operator", "dynamic"]
    for c in report.candidates:
        assert c["speedup"] > 0 and c["int8_median_ms"] > 0 and 0.9 < c["cosine"] <= 1.0 and c["pass"] is True
    kept = [c for c in report.candidates if c["kept"]]
    assert len(kept) == 1 and kept[0]["name"] == C.pick(report.candidates)[0] and kept[0]["why"]
    # The file written is the kept candidate's: integer matrix kernels of its own kind, and its report.
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    if kept[0]["name"] == "dynamic":
        assert "MatMulInteger" in ops and report.options["tool"] == "quantize_dynamic"
    else:
        assert "QLinearMatMul" in ops and report.options["tool"] == "quantize_static"
    assert report.vs_fp32["speedup"] == kept[0]["speedup"] and report.vs_fp32["faster"] == (kept[0]["speedup"] > 1)
    assert list(tmp_path.glob("int8-candidates-*")) == []  # the candidates' work folder is gone


def _wide_add(path: Path, seed: int = 0, shifts: int = 1) -> Path:
    """A convolution whose output is shifted by 10,000 on one channel and back: the Add's output spans a range
    that one int8 scale cannot hold (a step of ~40 against features of ~1), so quantizing it wrecks the output,
    while the convolution alone quantizes fine. ``shifts``: that many shifts and shifts back in a row (the first
    ``shift``, then ``shift1``, ...), so that no single layer kept in float mends the output."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    big = np.zeros((1, 8, 1, 1), np.float32)
    big[0, 0] = 1e4
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(big, "big")]
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
    ]
    x = "r"
    for k in range(shifts):
        n = str(k or "")
        nodes.append(helper.make_node("Add", [x, "big"], [f"shifted{n}"], name=f"shift{n}"))
        nodes.append(helper.make_node("Sub", [f"shifted{n}", "big"], [f"back{n}"], name=f"unshift{n}"))
        x = f"back{n}"
    nodes += [
        helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["output"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes,
        "wide_add",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_quantize_for_cpu_keeps_the_candidate_that_passes_when_a_faster_one_fails_the_gate(tmp_path: Path):
    source = _wide_add(tmp_path / "m.onnx")
    x = np.random.default_rng(3).standard_normal((8, 3, 16, 16)).astype(np.float32)
    spec = BuildSpec(precision="int8", shapes={"input": [1, 3, 16, 16]})
    info = inspect_upload(source, tmp_path / "inspect").info
    out = tmp_path / "model.int8.onnx"
    report = C.quantize_for_cpu(source, {"input": x}, out, spec, info, tmp_path, _opened([]))
    by_name = {c["name"]: c for c in report.candidates}
    assert list(by_name) == ["operator", "convolutions"]
    assert by_name["operator"]["pass"] is False and by_name["operator"]["cosine"] < 0.98  # the Add in int8
    assert by_name["convolutions"]["pass"] is True and by_name["convolutions"]["kept"] is True
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "QLinearConv" in ops and "QLinearAdd" not in ops and "Add" in ops
