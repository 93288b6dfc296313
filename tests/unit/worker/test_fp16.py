"""Mixed fp16/fp32 conversion for strongly typed builds: small graphs with the patterns that break a
whole-graph conversion (YOLOv8's run-time anchor grid, out-of-range constants, a decomposed LayerNorm
on large activations, If subgraphs, external data), checked for type-correctness, against ONNX
Runtime fp32 outputs, and with TensorRT-RTX builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.errors import SpecInvalid
from tests.helpers import rtx_build
from worker.rewrite import onnxgraph as G
from worker.rewrite.fp16 import convert as fp16_convert
from worker.rewrite.fp16 import fp16_model
from worker.rewrite.fp16 import keep_fp32 as F

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
OPSET = 17


def _c(name: str, value, dtype=np.float32) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(nodes, inputs, outputs, inits, opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def anchor_head() -> onnx.ModelProto:
    """A YOLOv8 Detect head in miniature: anchors built at run time from the feature map's size.

    Shape -> Gather -> Cast(float) -> Range -> +0.5 -> Reshape/Expand to a grid whose shape comes
    from Shape of the Range output, added to box predictions taken from a Conv.
    """
    N = helper.make_node
    inits = [
        _c("i2", 2, np.int64),
        _c("i3", 3, np.int64),
        _c("zero", 0.0),
        _c("one", 1.0),
        _c("half", 0.5),
        _c("col", [-1, 1], np.int64),
        _c("row", [1, -1], np.int64),
        _c("last", [-1], np.int64),
        _c("pairs", [-1, 2], np.int64),
        _c("flat", [0, 4, -1], np.int64),
        _c("s0", [0], np.int64),
        _c("s2", [2], np.int64),
        _c("ax2", [2], np.int64),
        numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype(np.float32), "w"),
    ]
    nodes = [
        N("Conv", ["x", "w"], ["c"], name="conv"),
        N("Shape", ["c"], ["s"], name="shape"),
        N("Gather", ["s", "i2"], ["hi"], name="gather_h", axis=0),
        N("Gather", ["s", "i3"], ["wi"], name="gather_w", axis=0),
        N("Cast", ["hi"], ["hf"], name="cast_h", to=FLOAT),
        N("Cast", ["wi"], ["wf"], name="cast_w", to=FLOAT),
        N("Range", ["zero", "hf", "one"], ["ry0"], name="range_h"),
        N("Range", ["zero", "wf", "one"], ["rx0"], name="range_w"),
        N("Add", ["ry0", "half"], ["ry"], name="offset_h"),
        N("Add", ["rx0", "half"], ["rx"], name="offset_w"),
        N("Shape", ["ry"], ["sy"], name="shape_h"),
        N("Shape", ["rx"], ["sx"], name="shape_w"),
        N("Concat", ["sy", "sx"], ["grid_shape"], name="grid_shape", axis=0),
        N("Reshape", ["ry", "col"], ["ry2"], name="col_h"),
        N("Reshape", ["rx", "row"], ["rx2"], name="row_w"),
        N("Expand", ["ry2", "grid_shape"], ["gy"], name="expand_h"),
        N("Expand", ["rx2", "grid_shape"], ["gx"], name="expand_w"),
        N("Unsqueeze", ["gx", "last"], ["gx1"], name="unsq_w"),
        N("Unsqueeze", ["gy", "last"], ["gy1"], name="unsq_h"),
        N("Concat", ["gx1", "gy1"], ["grid2"], name="grid", axis=-1),
        N("Reshape", ["grid2", "pairs"], ["grid"], name="grid_flat"),
        N("Reshape", ["c", "flat"], ["cf"], name="flatten"),
        N("Transpose", ["cf"], ["ct"], name="transpose", perm=[0, 2, 1]),
        N("Slice", ["ct", "s0", "s2", "ax2"], ["box"], name="slice"),
        N("Add", ["box", "grid"], ["y"], name="decode"),
    ]
    x = helper.make_tensor_value_info("x", FLOAT, ["n", 4, "h", "w"])
    y = helper.make_tensor_value_info("y", FLOAT, ["n", None, 2])
    return _model(nodes, [x], [y], inits)


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _types(path: Path) -> dict[str, int]:
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), strict_mode=True, check_type=True)
    return G.tensor_types(model.graph)


def _node(path: Path, name: str) -> onnx.NodeProto:
    return next(n for n in onnx.load(str(path)).graph.node if n.name == name)


ANCHOR_SHAPES = {"x": ((1, 4, 8, 8), (1, 4, 16, 16), (2, 4, 32, 32))}


def test_anchor_grid_fails_with_whole_graph_conversion_and_builds_with_ours(tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = _save(anchor_head(), tmp_path / "anchors.onnx")
    naive = _save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), tmp_path / "naive.onnx")
    built, error = rtx_build(naive, ANCHOR_SHAPES)
    assert not built
    assert "differs from input 1's element type (half)" in error

    ours = tmp_path / "ours.onnx"
    report = fp16_model(src, ours)
    built, error = rtx_build(ours, ANCHOR_SHAPES)
    assert built, error

    types = _types(ours)
    for name in ("range_h", "range_w"):
        assert all(types[i] == FLOAT for i in _node(ours, name).input)
    assert types["hf"] == types["wf"] == FLOAT  # the Casts of the sizes stay float32
    assert _node(ours, "conv").op_type == "Conv" and types[_node(ours, "conv").input[1]] == FLOAT16
    assert report.kept_fp32_nodes["range_h"] == F.NO_FP16
    assert report.kept_fp32_nodes["cast_w"] == F.SHAPE  # it feeds Range's limit
    assert report.kept_fp32_nodes["expand_h"] == F.SHAPE_DERIVED
    assert "conv" not in report.kept_fp32_nodes and "decode" not in report.kept_fp32_nodes
    assert report.fp16_nodes + report.fp32_nodes + report.other_nodes == report.nodes == 25
    assert report.kept_fp32[F.NO_FP16] == {"Range": 2}
    assert report.converter.startswith("onnxruntime.transformers.float16 (onnxruntime ")

    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    ref, got = _run(src, {"x": x})[0], _run(ours, {"x": x})[0]
    # Anchor coordinates are exact; the box part went through an fp16 Conv.
    np.testing.assert_allclose(got, ref, atol=0.02)


def mixed_net() -> onnx.ModelProto:
    """Conv + SiLU, a squeeze-excitation block (global average pool), a MatMul, LayerNorm, Softmax."""
    N = helper.make_node
    rng = np.random.default_rng(6)
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
        for name, shape in (("w1", (8, 4, 3, 3)), ("w2", (8, 8, 1, 1)), ("wm", (8, 16)))
    ]
    inits += [_c("gamma", np.ones(16)), _c("beta", np.zeros(16)), _c("flat", [0, 8, -1], np.int64)]
    nodes = [
        N("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        N("Sigmoid", ["c1"], ["s1"], name="sig1"),
        N("Mul", ["c1", "s1"], ["silu"], name="silu"),
        N("GlobalAveragePool", ["silu"], ["gap"], name="gap"),
        N("Conv", ["gap", "w2"], ["se0"], name="se_conv"),
        N("Sigmoid", ["se0"], ["se1"], name="se_sig"),
        N("Mul", ["silu", "se1"], ["se"], name="se_scale"),
        N("Reshape", ["se", "flat"], ["r"], name="flatten"),
        N("Transpose", ["r"], ["t"], name="to_tokens", perm=[0, 2, 1]),
        N("MatMul", ["t", "wm"], ["m"], name="proj"),
        N("LayerNormalization", ["m", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        N("Softmax", ["ln"], ["y"], name="softmax", axis=-1),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, ["n", 4, "h", "w"])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", "tokens", 16])],
        inits,
    )


def test_mixed_net_builds_for_turing_and_ampere(tmp_path):
    """TensorRT-RTX has no float32 GEMM on Turing: the MatMul must be fp16 for sm75 to build at all."""
    src, out = _save(mixed_net(), tmp_path / "mixed.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32 == {F.SENSITIVE: {"GlobalAveragePool": 1, "LayerNormalization": 1}}
    types = _types(out)
    assert types[_node(out, "proj").output[0]] == FLOAT16
    for target in ("sm75", "sm86"):
        built, error = rtx_build(out, ANCHOR_SHAPES, target)
        assert built, f"{target}: {error}"
    assert report.notes == []
    x = np.random.default_rng(7).standard_normal((1, 4, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(src, {"x": x})[0], atol=2e-3)
    # Keeping the MatMul in float32 is allowed, and the report says what it costs.
    kept = fp16_model(src, tmp_path / "kept.onnx", keep_fp32_op_types=["MatMul"])
    assert any("sm75" in note and "proj" in note for note in kept.notes)


def test_shape_subgraph_feeding_reshape_stays_float32(tmp_path):
    """Float arithmetic that only computes a shape (Cast -> Mul -> Cast to int64 -> Reshape)."""
    N = helper.make_node
    nodes = [
        N("Relu", ["x"], ["r"], name="relu"),
        N("Shape", ["r"], ["s"], name="shape"),
        N("Cast", ["s"], ["sf"], name="to_float", to=FLOAT),
        N("Mul", ["sf", "scale"], ["sm"], name="scale_shape"),
        N("Cast", ["sm"], ["si"], name="to_int", to=TensorProto.INT64),
        N("Reshape", ["r", "si"], ["y"], name="reshape"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", FLOAT, ["a", "b"])],
        [_c("scale", [2.0, 0.5])],
    )
    src, out = _save(model, tmp_path / "m.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32_nodes == {"to_float": F.SHAPE, "scale_shape": F.SHAPE, "to_int": F.SHAPE}
    types = _types(out)
    assert types["sm"] == FLOAT and types["r"] == FLOAT16
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert _run(out, {"x": x})[0].shape == (4, 3)


def test_user_keep_lists_and_unknown_node(tmp_path):
    src = _save(anchor_head(), tmp_path / "anchors.onnx")
    out = tmp_path / "out.onnx"
    report = fp16_model(src, out, keep_fp32_nodes=["conv"], keep_fp32_op_types=["Transpose"])
    types = _types(out)
    conv = _node(out, "conv")
    assert [types[i] for i in conv.input] == [FLOAT, FLOAT]
    assert types[_node(out, "transpose").output[0]] == FLOAT
    assert report.kept_fp32_nodes["conv"] == F.USER_NODE
    assert report.kept_fp32_nodes["transpose"] == F.USER_OP
    # The weights of a kept node stay float32, bit for bit.
    weights = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    np.testing.assert_array_equal(
        numpy_helper.to_array(weights[conv.input[1]]), numpy_helper.to_array(anchor_head().graph.initializer[-1])
    )
    with pytest.raises(SpecInvalid, match="no_such_node"):
        fp16_model(src, tmp_path / "bad.onnx", keep_fp32_nodes=["no_such_node"])


@pytest.mark.parametrize("keep_io", [True, False])
def test_io_types(tmp_path, keep_io):
    src = _save(anchor_head(), tmp_path / "anchors.onnx")
    out = tmp_path / "out.onnx"
    fp16_model(src, out, keep_io_types=keep_io)
    model = onnx.load(str(out))
    want = FLOAT if keep_io else FLOAT16
    assert model.graph.input[0].type.tensor_type.elem_type == want
    assert model.graph.output[0].type.tensor_type.elem_type == want
    _types(out)  # type-correct either way
    x = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype(np.float32)
    ref = _run(src, {"x": x})[0]
    got = _run(out, {"x": x.astype(np.float32 if keep_io else np.float16)})[0]
    assert got.dtype == (np.float32 if keep_io else np.float16)
    np.testing.assert_allclose(got.astype(np.float32), ref, atol=0.02)


def test_if_node_bodies_converted_with_float32_boundaries(tmp_path):
    """The branches read an fp16-computed outer tensor and a weight an fp16 node also reads."""
    N = helper.make_node
    then_g = helper.make_graph(
        [N("Mul", ["h", "w"], ["t_out"], name="then_mul")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", FLOAT, None)],
    )
    else_g = helper.make_graph(
        [N("Sub", ["h", "w"], ["e_out"], name="else_sub")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", FLOAT, None)],
    )
    nodes = [
        N("Mul", ["x", "w"], ["h"], name="scale"),
        N("If", ["cond"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        N("Add", ["branch", "x"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", FLOAT, [3])],
        [_c("w", [1.5, -2.0, 3.0])],
    )
    src, out = _save(model, tmp_path / "if.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32_nodes == {"if": F.CONTROL_FLOW}
    assert (report.nodes, report.fp16_nodes) == (5, 4)  # scale, add and both branch bodies
    converted = onnx.load(str(out))
    types = _types(out)
    if_node = next(n for n in converted.graph.node if n.op_type == "If")
    assert types["h"] == FLOAT16 and types[if_node.output[0]] == FLOAT
    refs = G.outer_refs(if_node)
    assert all(types[r] == FLOAT for r in refs), refs  # the branches see float32 only
    assert {t.name: t.data_type for t in converted.graph.initializer} == {"w": FLOAT16, "w__fp32": FLOAT}
    branches = {a.name: a.g for a in if_node.attribute}
    mul = next(n for n in branches["then_branch"].node if n.name == "then_mul")
    casts = {n.output[0]: n for n in branches["then_branch"].node if n.op_type == "Cast"}
    assert all(G.cast_to(casts[i]) == FLOAT16 for i in mul.input)  # the body computes in fp16
    assert [o.name for o in branches["then_branch"].output] == ["t_out"]
    assert G.cast_to(casts["t_out"]) == FLOAT  # and hands float32 back
    # Kept whole in float32 on request: the branches stay as they were.
    whole = tmp_path / "whole.onnx"
    fp16_model(src, whole, convert_subgraphs=False)
    kept_if = next(n for n in onnx.load(str(whole)).graph.node if n.op_type == "If")
    assert sorted(n.op_type for a in kept_if.attribute for n in a.g.node) == ["Mul", "Sub"]
    x = np.array([1.0, 2.0, -3.0], np.float32)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        np.testing.assert_allclose(_run(out, feeds)[0], _run(src, feeds)[0], rtol=2e-3)


def test_weights_only_a_body_reads_move_into_it(tmp_path):
    """A weight read only inside both branches is stored fp16 in each, not cast from float32 at run time."""
    N = helper.make_node
    branches = {}
    for branch, op in (("then_branch", "Mul"), ("else_branch", "Add")):
        branches[branch] = helper.make_graph(
            [N(op, ["x", "k"], [f"{branch}_out"], name=f"{branch}_op")],
            branch,
            [],
            [helper.make_tensor_value_info(f"{branch}_out", FLOAT, [2])],
        )
    inputs = [
        helper.make_tensor_value_info("x", FLOAT, [2]),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
    ]
    model = _model(
        [N("If", ["cond"], ["y"], name="if", **branches)],
        inputs,
        [helper.make_tensor_value_info("y", FLOAT, [2])],
        [_c("k", [0.25, 4.0])],
    )
    src, out = _save(model, tmp_path / "w.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    converted = onnx.load(str(out))
    assert not converted.graph.initializer
    inner = {t.name: t.data_type for a in converted.graph.node[0].attribute for t in a.g.initializer}
    assert inner == {"if.then_branch/k": FLOAT16, "if.else_branch/k": FLOAT16}
    assert (report.initializers_fp16, report.initializers_fp32) == (2, 0)
    for cond in (True, False):
        feeds = {"x": np.array([2.0, -1.0], np.float32), "cond": np.array(cond)}
        np.testing.assert_allclose(_run(out, feeds)[0], _run(src, feeds)[0], rtol=1e-3)


def test_loop_body_with_carried_state_and_outer_reads(tmp_path):
    """acc <- acc * 0.5 + Relu(h) * w three times, h and w from outside; a ReduceSum of each step."""
    N = helper.make_node
    body = helper.make_graph(
        [
            N("Relu", ["h"], ["rh"], name="body_relu"),
            N("Mul", ["rh", "w"], ["t"], name="body_mul"),
            N("Mul", ["acc_in", "half"], ["ah"], name="body_decay"),
            N("Add", ["ah", "t"], ["acc_out"], name="body_add"),
            N("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
            N("ReduceSum", ["acc_out"], ["s"], name="body_sum", keepdims=0),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", FLOAT, [3]),
            helper.make_tensor_value_info("s", FLOAT, []),
        ],
        [_c("half", 0.5)],
    )
    nodes = [
        N("Mul", ["x", "w"], ["h"], name="scale"),
        N("Loop", ["trip", "", "x"], ["acc", "sums"], name="loop", body=body),
        N("Add", ["acc", "x"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [3])],
        [helper.make_tensor_value_info("y", FLOAT, [3]), helper.make_tensor_value_info("sums", FLOAT, [3])],
        [_c("w", [1.5, -2.0, 3.0]), _c("trip", 3, np.int64)],
    )
    src, out = _save(model, tmp_path / "loop.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32_nodes == {"loop": F.CONTROL_FLOW, "body_sum": F.SENSITIVE}
    assert report.fp16_nodes == 6  # scale, add, and relu/mul/decay/add in the body
    loop = next(n for n in onnx.load(str(out)).graph.node if n.op_type == "Loop")
    body = loop.attribute[0].g
    assert {t.name: t.data_type for t in body.initializer} == {"half": FLOAT16}
    assert [i.type.tensor_type.elem_type for i in body.input][2] == FLOAT  # carried state stays float32
    x = np.array([1.0, 2.0, -3.0], np.float32)
    for ref, got in zip(_run(src, {"x": x}), _run(out, {"x": x}), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-3)


def test_constant_beyond_fp16_range_keeps_its_reader(tmp_path):
    """A BatchNormalization variance of 1e8 (PP-OCRv4's detector has 9.8e7) must not be clamped to 65504."""
    N = helper.make_node
    inits = [_c("scale", [1.0, 1.0]), _c("bias", [0.0, 0.1]), _c("mean", [0.0, 5.0]), _c("var", [1e8, 4.0])]
    nodes = [
        N("Relu", ["x"], ["r"], name="relu"),
        N("BatchNormalization", ["r", "scale", "bias", "mean", "var"], ["y"], name="bn"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 2, 4, 4])],
        inits,
    )
    src, out = _save(model, tmp_path / "bn.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32_nodes == {"bn": F.CONST_RANGE}
    x = np.full((1, 2, 4, 4), 3000.0, np.float32)
    from onnxruntime.transformers.float16 import convert_float_to_float16

    naive = _save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), tmp_path / "naive.onnx")
    ref, got, bad = (_run(path, {"x": x})[0] for path in (src, out, naive))
    np.testing.assert_allclose(got, ref, rtol=1e-3)  # channel 0: 3000 / sqrt(1e8) = 0.3
    assert abs(float(bad[0, 0].max()) - 0.3) > 10  # clamped variance: 3000 / sqrt(65504) = 11.7


def test_mask_fill_of_float32_min_is_saturated_not_kept(tmp_path):
    """Attention masks filled with finfo(float32).min stay fp16 (as -65504) and still mask."""
    N = helper.make_node
    nodes = [
        N("Where", ["keep", "zero", "fill"], ["bias"], name="mask"),
        N("Add", ["scores", "bias"], ["masked"], name="add_mask"),
        N("Softmax", ["masked"], ["y"], name="softmax", axis=-1),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("scores", FLOAT, [2, 4]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [2, 4]),
        ],
        [helper.make_tensor_value_info("y", FLOAT, [2, 4])],
        [_c("zero", 0.0), _c("fill", float(np.finfo(np.float32).min))],
    )
    src, out = _save(model, tmp_path / "mask.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.fp32_nodes == 0 and report.fp16_nodes == 3
    feeds = {
        "scores": np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32),
        "keep": np.array([[True, True, False, False], [False, False, False, False]]),
    }
    ref, got = _run(src, feeds)[0], _run(out, feeds)[0]
    np.testing.assert_allclose(got[0], ref[0], atol=2e-3)
    # A row masked everywhere: float32 gives uniform weights, -inf would give NaN; -65504 gives
    # finite weights that sum to one.
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got.sum(axis=-1), [1.0, 1.0], atol=2e-3)


def test_decomposed_layernorm_on_large_activations(tmp_path):
    """Pow/ReduceMean on activations of a few hundred overflow fp16 (300^2 = 90000 > 65504)."""
    N = helper.make_node
    nodes = [
        N("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
        N("Sub", ["x", "mu"], ["d"], name="center"),
        N("Pow", ["d", "two"], ["sq"], name="square"),
        N("ReduceMean", ["sq"], ["var"], name="variance", axes=[-1]),
        N("Add", ["var", "eps"], ["ve"], name="add_eps"),
        N("Sqrt", ["ve"], ["std"], name="std"),
        N("Div", ["d", "std"], ["y"], name="normalize"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", FLOAT, [2, 64])],
        [_c("two", 2.0), _c("eps", 1e-5)],
    )
    src, out = _save(model, tmp_path / "ln.onnx"), tmp_path / "out.onnx"
    report = fp16_model(src, out)
    assert report.kept_fp32_nodes == {
        "mean": F.SENSITIVE,
        "square": F.SENSITIVE,
        "variance": F.SENSITIVE,
        "add_eps": F.CHAIN,
        "std": F.CHAIN,
    }
    x = np.random.default_rng(3).uniform(-600, 600, (2, 64)).astype(np.float32)
    assert ((x - x.mean(axis=-1, keepdims=True)) ** 2).max() > F.FP16_MAX  # the squares do not fit fp16
    ref, got = _run(src, {"x": x})[0], _run(out, {"x": x})[0]
    np.testing.assert_allclose(got, ref, atol=5e-3)
    assert _types(out)["sq"] == FLOAT
    # With nothing kept, the squares are typed fp16: a strongly typed build computes them in fp16.
    # (ONNX Runtime's CPU provider would not show the overflow: it runs ops that lack fp16 kernels,
    # such as Pow, in float32 and only casts at the edges of such runs.)
    everything = tmp_path / "all.onnx"
    fp16_model(src, everything, precision_sensitive_ops=())
    assert _types(everything)["sq"] == FLOAT16


def test_constant_node_shared_by_fp16_and_fp32_readers(tmp_path):
    N = helper.make_node
    nodes = [
        N("Constant", [], ["k"], name="k", value=helper.make_tensor("kv", FLOAT, [], [3.0])),
        N("Mul", ["x", "k"], ["a"], name="mul"),
        N("Shape", ["x"], ["s"], name="shape"),
        N("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        N("Cast", ["n"], ["nf"], name="cast", to=FLOAT),
        N("Range", ["k", "nf", "one"], ["r"], name="range"),
        N("ReduceSum", ["r", "axis0"], ["rs"], name="sum", keepdims=1),
        N("Add", ["a", "rs"], ["y"], name="add"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [6])],
        [helper.make_tensor_value_info("y", FLOAT, [6])],
        [_c("zero", 0, np.int64), _c("one", 1.0), _c("axis0", [0], np.int64)],
    )
    src, out = _save(model, tmp_path / "k.onnx"), tmp_path / "out.onnx"
    fp16_model(src, out)
    types = _types(out)
    converted = onnx.load(str(out))
    kinds = {
        n.output[0]: numpy_helper.to_array(n.attribute[0].t).dtype
        for n in converted.graph.node
        if n.op_type == "Constant"
    }
    assert kinds == {"k": np.float16, "k__fp32": np.float32}
    assert types[_node(out, "range").input[0]] == FLOAT
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(src, {"x": x})[0], rtol=1e-3)


def test_external_data_is_streamed_to_a_new_file(tmp_path):
    src_dir, out_dir = tmp_path / "src", tmp_path / "out"
    src_dir.mkdir()
    rng = np.random.default_rng(4)
    big = rng.standard_normal((256, 256)).astype(np.float32)
    kept = rng.standard_normal((256,)).astype(np.float32) * 100
    N = helper.make_node
    nodes = [
        N("MatMul", ["x", "w"], ["h"], name="matmul"),
        N("LayerNormalization", ["h", "gamma", "beta"], ["y"], name="ln", axis=-1),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", FLOAT, [2, 256])],
        [helper.make_tensor_value_info("y", FLOAT, [2, 256])],
        [
            numpy_helper.from_array(big, "w"),
            numpy_helper.from_array(kept, "gamma"),
            numpy_helper.from_array(np.zeros(256, np.float32), "beta"),
        ],
    )
    src = src_dir / "model.onnx"
    onnx.save(model, str(src), save_as_external_data=True, location="weights.bin", size_threshold=0)
    out = out_dir / "model.fp16.onnx"
    report = fp16_model(src, out)
    assert report.external_data == "model.fp16.onnx.data"
    converted = onnx.load(str(out), load_external_data=False)
    locations = {t.name: {e.key: e.value for e in t.external_data}.get("location") for t in converted.graph.initializer}
    assert set(locations.values()) == {"model.fp16.onnx.data"}  # nothing points at the source file
    loaded = {t.name: numpy_helper.to_array(t, str(out_dir)) for t in converted.graph.initializer}
    assert loaded["w"].dtype == np.float16 and loaded["gamma"].dtype == np.float32
    np.testing.assert_array_equal(loaded["gamma"], kept)
    np.testing.assert_allclose(loaded["w"], big, atol=2e-3)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_allclose(_run(out, {"x": x})[0], _run(src, {"x": x})[0], rtol=2e-3, atol=0.05)


def test_invalid_result_is_a_build_failure(tmp_path, monkeypatch):
    """A conversion that yields a graph ONNX rejects is reported, not written silently."""
    from enginefarm.core.errors import BuildFailed

    src = _save(anchor_head(), tmp_path / "anchors.onnx")

    def break_graph(model, added, opset):
        model.graph.node[0].input[0] = "nope"

    monkeypatch.setattr(fp16_convert, "fold_round_trips", break_graph)
    with pytest.raises(BuildFailed, match="invalid model"):
        fp16_model(src, tmp_path / "out.onnx")


def test_two_casts_of_one_tensor_under_one_name_become_one():
    """onnxruntime-gpu 1.31's converter named a cast after its tensor once per input slot: a float32 Concat reading
    one fp16 tensor twice got two ``sq_cast_to_fp32`` and the conversion failed its SSA check (seen on an H100)."""
    casts = [helper.make_node("Cast", ["sq"], ["sq_cast_to_fp32"], name=f"sq_cast_{i}", to=FLOAT) for i in range(2)]
    concat = helper.make_node("Concat", ["sq_cast_to_fp32", "sq_cast_to_fp32"], ["y"], name="pair", axis=1)
    graph = helper.make_graph(
        [*casts, concat],
        "g",
        [helper.make_tensor_value_info("sq", FLOAT16, [1, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    with pytest.raises(onnx.checker.ValidationError, match="single static assignment"):
        onnx.checker.check_model(model, full_check=True)
    fp16_convert.fold_round_trips(model, {"sq_cast_0", "sq_cast_1"}, OPSET)
    onnx.checker.check_model(model, full_check=True)
    assert [n.name for n in model.graph.node] == ["sq_cast_0", "pair"]
    x = np.arange(4, dtype=np.float16).reshape(1, 4)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"sq": x})
    np.testing.assert_array_equal(y, np.concatenate([x, x], axis=1).astype(np.float32))
