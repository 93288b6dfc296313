"""The int8-against-fp32 figure: interleaved blocks, both medians, and the not-faster mark with its figure. No
timing is asserted here (bench/models.py measures); only what gets recorded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from enginefarm.graph.samples import save_conv_net
from enginefarm.spec import BuildSpec
from enginefarm.worker import int8_vs_fp32 as V
from enginefarm.worker.evaluate import OrtRunner
from enginefarm.worker.quantize import quantize_qdq


def test_interleaved_alternates_the_order_and_times_both():
    calls: list[str] = []
    a, b = V.interleaved(lambda: calls.append("a"), lambda: calls.append("b"), rounds=4, block_s=0.0)
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


def test_the_quantize_stage_first_look_builds_both_artifacts_and_records_the_figure(tmp_path: Path):
    source = save_conv_net(tmp_path / "m.onnx", seed=3)
    x = np.random.default_rng(3).standard_normal((8, 3, 32, 32)).astype(np.float32)
    q = tmp_path / "q.onnx"
    quantize_qdq(source, {"input": x}, q, family="onnxruntime")
    assert any(n.op_type == "QLinearConv" for n in onnx.load(str(q)).graph.node)
    spec = BuildSpec(shapes={"input": [1, 3, 32, 32]})
    opened: list[Path] = []

    def runner(path: Path) -> OrtRunner:
        opened.append(path)
        return OrtRunner(path, threads=1)

    figure = V.models_compared(source, q, spec, {"input": x[:1]}, runner, rounds=2)
    assert [p.name for p in opened] == ["fp32.onnx", "int8.onnx"]
    assert figure["fp32_median_ms"] > 0 and figure["int8_median_ms"] > 0 and figure["int8_calls"] >= 2
    assert figure["faster"] == (figure["speedup"] > 1.0) and ("note" in figure) == (not figure["faster"])
