"""Failures a user can act on: the node, what it means, the next step; never a message cut mid-word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.domain import Target
from enginefarm.core.errors import BuildFailed
from enginefarm.core.spec import BuildSpec
from worker.backends.base import BuildLog
from worker.diagnose import explain, first_sentence
from worker.pipeline import engine_from_model

# The TensorRT-RTX 1.7.1 builder's text for an all-fp16 YOLOv8 (its last sentence arrives cut: "It is no)").
YOLO_FP16 = (
    "the builder produced no engine: [ERROR] IBuilder::buildSerializedNetwork: Error Code 1: Myelin "
    "([shape.cpp:175: ~op_constraints_msg_streamer_t] \nError during shape inference of\nmul_output_U140 = "
    "mul(coordValue_U136, /model.22/Range_5_shape_U137_cast_F16), name=/model.22/Range_5_shape_U139_mul\nError is:\n"
    "Input 0's element type (float) differs from input 1's element type (half).; [shape.cpp:175: "
    "~op_constraints_msg_streamer_t] \nError during shape inference of\nadd_output_U141 : f32[] = add(mul_output_U140, "
    "coordValue_U138), name=/model.22/Range_5_shape_U139_add\nError is:\nIt is no)"
)
IF_ASSERT = (
    "the builder produced no engine: [ERROR] [graphScope.cpp::analyze::471] Error Code 2: Internal Error "
    "(Assertion tScope.getType() != ScopeType::kUNDEFINED failed.  In analyze at "
    "/_src/optimizer/common/graphScope.cpp:471)"
)


def _save(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _range_model(path: Path) -> Path:
    """The node names of a YOLOv8 head: a Range fed by a Cast, as the builder's layer names refer to them."""
    nodes = [
        helper.make_node("Cast", ["n"], ["/model.22/Cast_5_output_0"], name="/model.22/Cast_5", to=TensorProto.FLOAT),
        helper.make_node("Range", ["start", "/model.22/Cast_5_output_0", "step"], ["r"], name="/model.22/Range_5"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.float32), "start"),
        numpy_helper.from_array(np.array(1, np.float32), "step"),
    ]
    return _save(
        path,
        nodes,
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        inits,
    )


def test_mixed_type_failure_names_the_onnx_node_and_the_fix(tmp_path):
    said = explain(YOLO_FP16, _range_model(tmp_path / "m.onnx"))
    assert "at node '/model.22/Range_5' (Range, inputs: start, /model.22/Cast_5_output_0, step)" in said
    assert "keep_fp32_ops" in said and "keep_fp32_layers" in said
    assert said.endswith("Input 0's element type (float) differs from input 1's element type (half).")
    assert "It is no" not in said and "shape.cpp" not in said


def test_if_assertion_names_the_if_node(tmp_path):
    then_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
    )
    nodes = [helper.make_node("If", ["c"], ["y"], name="rate_branch", then_branch=then_g, else_branch=then_g)]
    path = _save(
        tmp_path / "if.onnx",
        nodes,
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    said = explain(IF_ASSERT, path)
    assert said.startswith("TensorRT-RTX cannot build this If node") and "node 'rate_branch' (If, inputs: c)" in said
    assert "fixed_inputs" in said and "graph_cleanup=onnxslim" in said and "onnxruntime" in said
    assert said.endswith("Assertion tScope.getType() != ScopeType::kUNDEFINED failed.") and "(Assertion" not in said


@pytest.mark.parametrize(
    "text, complete",
    [
        ("Error is:\nInput 0's type differs.; trailing\nError is:\nIt is no)", "Input 0's type differs."),
        (
            "Assertion tScope.getType() != X failed.  In analyze at /_src/a.cpp:1)",
            "Assertion tScope.getType() != X failed.",
        ),
        ("no sentence end here", "no sentence end here"),
    ],
)
def test_first_sentence_keeps_only_complete_sentences(text, complete):
    assert first_sentence(text) == complete


def test_unknown_failure_keeps_the_text_and_adds_the_node(tmp_path):
    path = _range_model(tmp_path / "m.onnx")
    said = explain("the ONNX parser rejected the model: /model.22/Range_5: something new happened.", path)
    assert said == (
        "the ONNX parser rejected the model at node '/model.22/Range_5' (Range, inputs: start, "
        "/model.22/Cast_5_output_0, step): /model.22/Range_5: something new happened."
    )


def test_a_real_turing_fp32_gemm_build_fails_with_node_and_next_step(tmp_path):
    """A real TensorRT-RTX build: sm75 cannot compile an fp32 MatMul; the message names the node that hit it."""
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W")
    path = _save(
        tmp_path / "mm.onnx",
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="proj")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [w],
    )
    log = BuildLog(limit=400)
    with pytest.raises(BuildFailed) as failed:
        engine_from_model(path, BuildSpec(), Target.parse("tensorrt-rtx/sm75"), None, tmp_path, log)
    said = failed.value.message
    assert said.startswith("TensorRT-RTX cannot compile fp32 matrix multiplies")
    assert "node 'proj' (MatMul, inputs: x, W)" in said and "build fp16 for sm75" in said
    assert any("FP32 GEMM is not supported" in line for line in log.lines)  # the builder's own words stay in the log


def test_shape_mismatch_gets_a_next_step_and_no_cuda_driver_noise():
    text = (
        "the ONNX parser rejected the model: If_0_else_branch/decoder/rnn/LSTM: Input 0 and 1 must have same number "
        "of dimensions, but have 5 and 3. (cudaError 35: CUDA driver version is insufficient for CUDA runtime version)"
    )
    said = explain(text)
    assert said.startswith("the shapes this build gives do not fit what the model computes")
    assert "Next step: check the spec's shapes and fixed inputs" in said and "cudaError" not in said
