"""Int8 quantization by ONNX Runtime's tool, one recipe per target family: the sample conv net calibrated on
seeded data, checked for TensorRT's symmetric int8 rules (the tensorrt recipe), for integer kernels in the graph
ONNX Runtime runs (the onnxruntime recipe, on a real conv net too) and for accuracy against FP32 on held-out
inputs; and bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from enginefarm.core.errors import BuildFailed, SpecInvalid
from enginefarm.graph.modelfile import inspect_upload
from enginefarm.graph.samples import conv_net, save_conv_net
from tests.helpers import rtx_build
from worker.int8 import quantize as Q
from worker.int8.quantize import QuantizeReport, quantize_qdq
from worker.int8.quantize import preprocess as QP
from worker.int8.quantize import recipes as QR
from worker.int8.quantize.qdq import check_for_tensorrt

CALIBRATION = 16
HELD_OUT = 64


def _images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 3, 32, 32)).astype(np.float32)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def _metrics(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    r, c = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    diff = np.abs(c - r)
    return {
        "cosine": float(r @ c / (np.linalg.norm(r) * np.linalg.norm(c))),
        "rel_l2": float(np.linalg.norm(c - r) / np.linalg.norm(r)),
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
    }


def _scales(path: Path) -> dict[str, np.ndarray]:
    inits = onnx.load(str(path)).graph.initializer
    return {t.name: numpy_helper.to_array(t) for t in inits if t.name.endswith("_scale")}


def _report(label: str, m: dict[str, float]) -> None:
    print(f"\nint8 vs fp32 on {HELD_OUT} held-out inputs ({label}): " + ", ".join(f"{k}={v:.6g}" for k, v in m.items()))


def _fixed_batch_net(path: Path, batch: int) -> Path:
    """The sample net with its batch dim fixed, to exercise inputs whose samples cannot be split."""
    model = conv_net(seed=1)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    return save_conv_net(tmp_path_factory.mktemp("fp32") / "model.onnx", seed=7)


@pytest.fixture(scope="module")
def quantized(fp32: Path, tmp_path_factory) -> tuple[Path, QuantizeReport]:
    out = tmp_path_factory.mktemp("int8") / "model.int8.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, out)
    return out, report


# --------------------------------------------------------------------------- the quantized model


def test_report_and_qdq_nodes(quantized, tmp_path: Path) -> None:
    out, report = quantized
    model = onnx.load(str(out))
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert report.quantized_nodes == len(qdq) > 0
    assert report.calibration_samples == CALIBRATION
    assert report.method == (
        "onnxruntime.quantization.quantize_static, TensorRT Q/DQ, per-channel, symmetric int8 "
        "activations and weights, MinMax"
    )
    assert report.family == "tensorrt" and report.options["extra_options"]["ActivationSymmetric"] is True
    assert report.preprocessed and report.preprocess_error is None
    assert report.onnxruntime_version == ort.__version__
    assert report.to_dict()["op_types"] == report.op_types
    assert inspect_upload(out, tmp_path / "inspect").info.has_qdq
    print(f"\nquantize report: {report.to_dict()}")


def test_every_conv_and_the_matmul_are_quantized(quantized) -> None:
    _, report = quantized
    assert report.op_types["Conv"] == 2
    assert report.op_types["MatMul"] == 1


def test_symmetric_int8_for_tensorrt(quantized) -> None:
    """Zero points are int8 zeros, weights per output channel, bias left in float (no int32 DQ)."""
    out, _ = quantized
    model = onnx.load(str(out))
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for node in nodes:
        zp = inits[node.input[2]]
        assert zp.data_type == TensorProto.INT8, node.name
        assert not numpy_helper.to_array(zp).any(), node.name
        assert inits[node.input[1]].data_type == TensorProto.FLOAT
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            assert inits[node.input[0]].data_type == TensorProto.INT8
    scales = {name: numpy_helper.to_array(t) for name, t in inits.items() if name.endswith("_scale")}
    assert scales["conv0.w_scale"].shape == (16,) and scales["conv1.w_scale"].shape == (16,)
    assert scales["fc.w_scale"].shape == (10,)
    assert inits["conv0.b"].data_type == TensorProto.FLOAT


def test_int8_accuracy_vs_fp32_on_held_out_inputs(fp32: Path, quantized) -> None:
    out, _ = quantized
    x = _images(HELD_OUT, seed=1234)  # not the calibration seed
    ref, got = _run(fp32, x), _run(out, x)
    assert got.shape == ref.shape == (HELD_OUT, 10)
    m = _metrics(ref, got)
    _report("minmax", m)
    assert m["cosine"] > 0.99
    assert m["rel_l2"] < 0.1


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_other_calibration_methods(fp32: Path, quantized, tmp_path: Path, method: str) -> None:
    out = tmp_path / "model.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, out, method=method.capitalize())
    assert report.method.endswith(f", {method.capitalize()}")
    scales, minmax = _scales(out), _scales(quantized[0])
    if method == "percentile":  # ORT's entropy calibrator, at the 128 bins quantize_static gives it, can match MinMax
        assert any(not np.allclose(scales[k], minmax[k]) for k in minmax), "ranges identical to MinMax"
    x = _images(HELD_OUT, seed=1234)
    m = _metrics(_run(fp32, x), _run(out, x))
    _report(method, m)
    assert m["cosine"] > 0.99


@pytest.mark.parametrize("batch, chunk", [(5, QR._CHUNK_BATCHES), (1, 3)])
def test_batching_does_not_change_minmax_ranges(
    fp32: Path, quantized, tmp_path: Path, monkeypatch, batch: int, chunk: int
) -> None:
    """Neither the calibration batch nor merging ranges chunk by chunk moves a MinMax range."""
    monkeypatch.setattr(QR, "_CHUNK_BATCHES", chunk)
    out, _ = quantized
    batched = tmp_path / "batched.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, batched, calibration_batch=batch)
    assert report.calibration_samples == CALIBRATION
    a = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(batched)).graph.initializer}
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, err_msg=name)


def test_an_output_that_does_not_load_is_removed(fp32: Path, tmp_path: Path, monkeypatch) -> None:
    out, session = tmp_path / "q.onnx", ort.InferenceSession

    def refuse_output(path, *args, **kwargs):
        if path == str(out):
            raise RuntimeError("no kernel")
        return session(path, *args, **kwargs)

    monkeypatch.setattr(Q.ort, "InferenceSession", refuse_output)
    with pytest.raises(BuildFailed, match="does not load: no kernel"):
        quantize_qdq(fp32, {"input": _images(2, seed=1)}, out)
    assert list(tmp_path.iterdir()) == []


def test_float64_samples_are_cast(fp32: Path, tmp_path: Path) -> None:
    report = quantize_qdq(fp32, {"input": _images(4, seed=2).astype(np.float64)}, tmp_path / "q.onnx")
    assert report.calibration_samples == 4


def test_fixed_batch_of_one_is_fed_sample_by_sample(tmp_path: Path) -> None:
    model = _fixed_batch_net(tmp_path / "b1.onnx", 1)
    report = quantize_qdq(model, {"input": _images(6, seed=3)}, tmp_path / "q.onnx", calibration_batch=4)
    assert report.calibration_samples == 6


def test_fixed_batch_over_one_takes_the_array_whole(tmp_path: Path) -> None:
    model = _fixed_batch_net(tmp_path / "b4.onnx", 4)
    out = tmp_path / "q.onnx"
    report = quantize_qdq(model, {"input": _images(4, seed=3)}, out)
    assert report.calibration_samples == 1
    assert _run(out, _images(4, seed=9)).shape == (4, 10)
    with pytest.raises(SpecInvalid, match="fixed first dim of 4") as exc:
        quantize_qdq(model, {"input": _images(8, seed=3)}, tmp_path / "q2.onnx")
    assert "'input'" in exc.value.message


def test_preprocessing_failure_falls_back_to_the_raw_model(fp32: Path, tmp_path: Path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("shape inference exploded")

    monkeypatch.setattr(QP, "quant_pre_process", broken)
    before = sorted(p.name for p in fp32.parent.iterdir())
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, {"input": _images(8, seed=1)}, out, scratch=tmp_path / "scratch")
    assert not report.preprocessed
    assert "shape inference exploded" in (report.preprocess_error or "")
    assert report.op_types["Conv"] == 2 and report.op_types["MatMul"] == 1
    assert sorted(p.name for p in fp32.parent.iterdir()) == before  # nothing written beside the input
    assert list((tmp_path / "scratch").iterdir()) == []  # the work folder is removed


def test_large_models_use_external_data(fp32: Path, quantized, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Q, "INLINE_LIMIT", 1024)
    out = tmp_path / "q.onnx"
    quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx", "q.onnx.data"]
    x = _images(8, seed=5)
    np.testing.assert_allclose(_run(out, x), _run(quantized[0], x), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- bad input


def test_missing_input_name(fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid) as exc:
        quantize_qdq(fp32, {"image": _images(4, seed=0)}, tmp_path / "q.onnx")
    assert "'input'" in exc.value.message and "'image'" in exc.value.message
    assert {tuple(p["loc"]) for p in exc.value.problems} == {("samples", "input"), ("samples", "image")}
    assert not (tmp_path / "q.onnx").exists()


def test_wrong_rank(fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="rank 3") as exc:
        quantize_qdq(fp32, {"input": _images(4, seed=0)[0]}, tmp_path / "q.onnx")
    assert "'input'" in exc.value.message
    assert exc.value.problems[0]["loc"] == ["samples", "input"]


def test_wrong_fixed_dim(fp32: Path, tmp_path: Path) -> None:
    x = np.zeros((4, 3, 16, 16), np.float32)
    with pytest.raises(SpecInvalid, match="fixes dim 2 to 32") as exc:
        quantize_qdq(fp32, {"input": x}, tmp_path / "q.onnx")
    assert "'input'" in exc.value.message


def test_zero_samples(fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="0 calibration samples") as exc:
        quantize_qdq(fp32, {"input": np.zeros((0, 3, 32, 32), np.float32)}, tmp_path / "q.onnx")
    assert "'input'" in exc.value.message


@pytest.mark.parametrize(
    "bad, words",
    [
        (np.full((2, 3, 32, 32), "x"), "give real numbers"),
        (np.zeros((2, 3, 32, 32), np.complex64), "give real numbers"),
        (np.full((2, 3, 32, 32), np.nan, np.float32), "NaN or infinity"),
    ],
)
def test_uncastable_samples(fp32: Path, tmp_path: Path, bad: np.ndarray, words: str) -> None:
    with pytest.raises(SpecInvalid, match=words) as exc:
        quantize_qdq(fp32, {"input": bad}, tmp_path / "q.onnx")
    assert "'input'" in exc.value.message


def test_bad_options(fp32: Path, tmp_path: Path) -> None:
    samples = {"input": _images(2, seed=0)}
    with pytest.raises(SpecInvalid, match="unknown calibration method 'kl'"):
        quantize_qdq(fp32, samples, tmp_path / "q.onnx", method="kl")
    with pytest.raises(SpecInvalid, match="calibration_batch"):
        quantize_qdq(fp32, samples, tmp_path / "q.onnx", calibration_batch=0)


def test_invalid_model_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an onnx model\n" * 10)
    with pytest.raises(BuildFailed):
        quantize_qdq(junk, {"input": _images(2, seed=0)}, tmp_path / "q.onnx")
    with pytest.raises(BuildFailed, match="does not exist"):
        quantize_qdq(tmp_path / "absent.onnx", {"input": _images(2, seed=0)}, tmp_path / "q.onnx")


def test_model_already_quantized(quantized, tmp_path: Path) -> None:
    with pytest.raises(BuildFailed, match="already holds QuantizeLinear"):
        quantize_qdq(quantized[0], {"input": _images(2, seed=0)}, tmp_path / "q.onnx")


def test_q_dq_models_skip_the_fused_int8_kernels_where_they_saturate(tmp_path, monkeypatch):
    """On x86 without VNNI, ONNX Runtime's fused int8 kernels saturate; the CPU engine and its runner keep the
    basic optimization level for Q/DQ models there, and the int8 engine stays close to FP32."""
    from enginefarm.measure import ort_runner as backend
    from enginefarm.measure.ort_runner import OrtRunner

    fp32_path = save_conv_net(tmp_path / "m.onnx", seed=42)
    x = _images(16, seed=42)
    q = tmp_path / "q.onnx"
    quantize_qdq(fp32_path, {"input": x}, q)
    levels = ort.GraphOptimizationLevel
    monkeypatch.setattr(backend, "cpu_has_vnni", lambda: False)
    assert backend.optimization_level(ort, q)[0] == levels.ORT_ENABLE_BASIC
    assert backend.optimization_level(ort, fp32_path)[0] == levels.ORT_ENABLE_ALL  # no Q/DQ: nothing to avoid
    got = OrtRunner(q, threads=1).infer({"input": x[:4]})
    m = _metrics(_run(fp32_path, x[:4]), next(iter(got.values())))
    assert m["rel_l2"] < 0.05 and m["cosine"] > 0.999, m
    monkeypatch.setattr(backend, "cpu_has_vnni", lambda: True)
    assert backend.optimization_level(ort, q)[0] == levels.ORT_ENABLE_ALL


# --------------------------------------------------------------------------- TensorRT's Q/DQ rules

_OPS_TAKING_INT8 = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Add"}


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _assert_tensorrt_placement(model: onnx.ModelProto) -> None:
    """Int8 constants feed only DequantizeLinear; DequantizeLinear feeds only ops that take int8; zero points 0."""
    consumers = _consumers(model)
    inits = {t.name: t for t in model.graph.initializer}
    for tensor in model.graph.initializer:
        if tensor.data_type == TensorProto.INT8:
            for user in consumers.get(tensor.name, []):
                assert user.op_type in ("QuantizeLinear", "DequantizeLinear"), (tensor.name, user.op_type)
                if user.input[0] == tensor.name:
                    assert user.op_type == "DequantizeLinear", tensor.name
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert not numpy_helper.to_array(inits[node.input[2]]).any()
        if node.op_type == "DequantizeLinear":
            weight = inits.get(node.input[0])
            assert weight is None or weight.data_type == TensorProto.INT8
            users = {u.op_type for u in consumers.get(node.output[0], [])}
            allowed = _OPS_TAKING_INT8 - {"Add"} if weight is not None else _OPS_TAKING_INT8
            assert users and users <= allowed, (node.name, users)


def _opset_12_net(path: Path) -> Path:
    """The sample net at opset 12, ending in a Softmax over a 3-D tensor: at opset 12 it normalizes over
    everything after axis 1, at 13 over the last axis only, so relabelling the opset would change it."""
    model = conv_net(seed=3)
    model.opset_import[0].version = 12
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 2, 5], np.int64), "split_shape"))
    model.graph.node.extend(
        [
            onnx.helper.make_node("Reshape", ["logits", "split_shape"], ["logits3"], name="reshape"),
            onnx.helper.make_node("Softmax", ["logits3"], ["probs"], name="softmax"),
        ]
    )
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 2, 5]))
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_opset_12_model_is_converted_to_13_and_builds_with_tensorrt_rtx(tmp_path: Path) -> None:
    fp32 = _opset_12_net(tmp_path / "opset12.onnx")
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, out)
    model = onnx.load(str(out))
    assert report.opset == 13 and report.opset_converted_from == 12
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
    axes = [a.i for n in model.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute if a.name == "axis"]
    assert sorted(axes) == [0, 0, 1]  # two Conv weights per output channel, the MatMul weight per column
    x = _images(HELD_OUT, seed=1234)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input": x})[0]
    np.testing.assert_allclose(got.sum(axis=(1, 2)), 1.0, rtol=1e-5)  # opset-12 Softmax semantics kept
    ref = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert _metrics(ref, got)["cosine"] > 0.99
    _assert_tensorrt_placement(model)
    built, error = rtx_build(out, {"input": ([1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32])})
    assert built, error


def test_an_opset_conversion_that_fails_is_a_clear_build_failure(tmp_path: Path, monkeypatch) -> None:
    def refuse(model, version):
        raise RuntimeError("No Adapter For Softmax")

    monkeypatch.setattr(Q.onnx.version_converter, "convert_version", refuse)
    with pytest.raises(
        BuildFailed,
        match=r"needs ONNX opset 13 or later .* model has opset 12; converting it "
        r"failed \(RuntimeError: No Adapter For Softmax\)",
    ):
        quantize_qdq(_opset_12_net(tmp_path / "m.onnx"), {"input": _images(2, seed=1)}, tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_an_opset_conversion_that_changes_outputs_is_refused(tmp_path: Path, monkeypatch) -> None:
    def relabel(model, version):  # a bare opset bump: the Softmax now normalizes over the last axis only
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.opset_import[0].version = version
        return out

    monkeypatch.setattr(Q.onnx.version_converter, "convert_version", relabel)
    with pytest.raises(BuildFailed, match=r"converted to opset 13 its output 'probs' differs from the original's"):
        quantize_qdq(_opset_12_net(tmp_path / "m.onnx"), {"input": _images(4, seed=1)}, tmp_path / "q.onnx")


def _shared_weight_net(path: Path) -> Path:
    """A MatMul weight that is also gathered from (a tied embedding) and used transposed by a second MatMul,
    plus an Add of a scalar constant: ONNX Runtime's quantizer turns that constant into an int8 tensor, which
    TensorRT refuses ("Quantized constant ... is only allowed before DQ")."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)
    nodes = [
        onnx.helper.make_node("Gather", ["W", "ids"], ["emb"], axis=0, name="embed"),
        onnx.helper.make_node("Add", ["x", "emb"], ["h"], name="mix"),
        onnx.helper.make_node("MatMul", ["h", "W"], ["y1"], name="proj"),
        onnx.helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0], name="transpose_w"),
        onnx.helper.make_node("MatMul", ["y1", "Wt"], ["y2"], name="proj_t"),
        onnx.helper.make_node("Add", ["y2", "half"], ["y"], name="shift"),
    ]
    return _save_graph(
        path,
        nodes,
        [
            onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16]),
            onnx.helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"]),
        ],
        [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )


def _token_feed(count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((count, 16)).astype(np.float32), "ids": rng.integers(0, 16, count)}


@pytest.mark.parametrize("preprocessing", ["folds the transpose", "fails"])
def test_shared_and_transposed_weights_give_no_quantized_constant_outside_dq(
    tmp_path: Path, monkeypatch, preprocessing: str
) -> None:
    if preprocessing == "fails":  # then Transpose(W) stays a computed tensor: that MatMul is left in float
        monkeypatch.setattr(QP, "quant_pre_process", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    fp32 = _shared_weight_net(tmp_path / "shared.onnx")
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, _token_feed(32, seed=1), out)
    model = onnx.load(str(out))
    _assert_tensorrt_placement(model)
    consumers = _consumers(model)
    assert "Gather" in {n.op_type for n in consumers["W_float"]}  # a float copy of the weight for the gather
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in consumers.get("half", []))
    if preprocessing == "fails":
        assert report.op_types == {"MatMul": 1}  # proj_t's weight is computed: left in float
    else:
        assert report.op_types == {"MatMul": 2}
    feed = _token_feed(16, seed=2)
    ref = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert _metrics(ref, got)["cosine"] > 0.99
    built, error = rtx_build(out, {"x": ([1, 16], [4, 16], [8, 16]), "ids": ([1], [4], [8])})
    assert built, error


def _residual_net(path: Path) -> Path:
    """Conv stem, a residual block (Conv-Relu-Conv + skip, then Relu), MaxPool, a Conv, a Sigmoid scaled by a
    constant Mul, global pooling and a Gemm head with a Softmax."""
    rng = np.random.default_rng(11)

    def w(*shape):
        return (rng.standard_normal(shape) * (2 / np.prod(shape[1:])) ** 0.5).astype(np.float32)

    inits = [
        numpy_helper.from_array(a, n)
        for n, a in [
            ("stem.w", w(8, 3, 3, 3)),
            ("b1.w", w(8, 8, 3, 3)),
            ("b2.w", w(8, 8, 3, 3)),
            ("c3.w", w(16, 8, 1, 1)),
            ("gain", np.array(1.5, np.float32)),
            ("fc.w", w(10, 16)),
            ("fc.b", np.zeros(10, np.float32)),
        ]
    ]
    conv = dict(pads=[1, 1, 1, 1])
    nodes = [
        onnx.helper.make_node("Conv", ["input", "stem.w"], ["s"], name="stem", **conv),
        onnx.helper.make_node("Relu", ["s"], ["s_r"], name="stem_relu"),
        onnx.helper.make_node("Conv", ["s_r", "b1.w"], ["b1"], name="block_conv1", **conv),
        onnx.helper.make_node("Relu", ["b1"], ["b1_r"], name="block_relu"),
        onnx.helper.make_node("Conv", ["b1_r", "b2.w"], ["b2"], name="block_conv2", **conv),
        onnx.helper.make_node("Add", ["b2", "s_r"], ["res"], name="residual_add"),
        onnx.helper.make_node("Relu", ["res"], ["res_r"], name="res_relu"),
        onnx.helper.make_node("MaxPool", ["res_r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        onnx.helper.make_node("Conv", ["p", "c3.w"], ["c3"], name="conv3"),
        onnx.helper.make_node("Sigmoid", ["c3"], ["c3_s"], name="sigmoid"),
        onnx.helper.make_node("Mul", ["c3_s", "gain"], ["c3_g"], name="scale"),
        onnx.helper.make_node("GlobalAveragePool", ["c3_g"], ["g"], name="gap"),
        onnx.helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        onnx.helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], transB=1, name="fc"),
        onnx.helper.make_node("Softmax", ["logits"], ["probs"], name="softmax"),
    ]
    return _save_graph(
        path,
        nodes,
        [onnx.helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [onnx.helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )


def test_only_the_inputs_of_weighted_ops_get_qdq_for_tensorrt(tmp_path: Path) -> None:
    fp32 = _residual_net(tmp_path / "res.onnx")
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, out)
    # The skip branch feeds a Conv and the residual Add: only the Conv takes its Q/DQ (DedicatedQDQPair).
    assert report.op_types == {"Conv": 4, "Gemm": 1}
    model = onnx.load(str(out))
    _assert_tensorrt_placement(model)
    by_name = {n.name: n for n in model.graph.node}
    producer = {o: n for n in model.graph.node for o in n.output}
    # MaxPool, Mul by a constant, Sigmoid, pooling, Softmax, the activations and the residual Add take no Q/DQ,
    # and the outputs of weighted ops are not quantized (OpTypesToExcludeOutputQuantization).
    for name in ("pool", "scale", "sigmoid", "gap", "flatten", "softmax", "stem_relu", "res_relu", "residual_add"):
        assert all(producer.get(i) is None or producer[i].op_type != "DequantizeLinear" for i in by_name[name].input), (
            name
        )
    weighted_outputs = {o for n in model.graph.node if n.op_type in ("Conv", "Gemm") for o in n.output}
    assert not weighted_outputs & {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    # Per output channel: Conv along axis 0, Gemm with transB=1 along axis 0 too.
    axes = {
        n.input[0]: [a.i for a in n.attribute if a.name == "axis"]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0].endswith(".w_quantized")
    }
    assert axes == {f"{w}.w_quantized": [0] for w in ("stem", "b1", "b2", "c3", "fc")}
    x = _images(HELD_OUT, seed=1234)
    ref = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    got = _run(out, x)
    assert _metrics(ref, got)["cosine"] > 0.99
    built, error = rtx_build(out, {"input": ([1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32])})
    assert built, error


# --------------------------------------------------------------------------- models that cannot be quantized


def _save_graph(path: Path, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    graph = onnx.helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _vec(name: str, *dims) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


_NOTHING = "found no operation to run in int8.*; build fp16 for this model instead"


def test_a_model_without_weighted_ops_says_so(tmp_path: Path) -> None:
    path = _save_graph(
        tmp_path / "m.onnx", [onnx.helper.make_node("Relu", ["x"], ["y"])], [_vec("x", "n", 4)], [_vec("y", "n", 4)]
    )
    with pytest.raises(BuildFailed, match=_NOTHING):
        quantize_qdq(path, {"x": np.ones((2, 4), np.float32)}, tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_a_model_with_only_activation_matmuls_says_so(tmp_path: Path) -> None:
    """Attention's MatMul of two computed tensors stays float for TensorRT (MatMulConstBOnly)."""
    nodes = [onnx.helper.make_node("MatMul", ["a", "b"], ["y"], name="scores")]
    path = _save_graph(tmp_path / "m.onnx", nodes, [_vec("a", "n", 4), _vec("b", 4, 4)], [_vec("y", "n", 4)])
    with pytest.raises(BuildFailed, match=_NOTHING):
        quantize_qdq(path, {"a": np.ones((2, 4), np.float32), "b": np.ones((4, 4), np.float32)}, tmp_path / "q.onnx")


def test_scalar_inputs_are_fed_as_given(tmp_path: Path) -> None:
    """A rank-0 input (a sample rate, a gain) is one value for every batch, not an array of one."""
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [onnx.helper.make_node("Mul", ["x", "gain"], ["xg"]), onnx.helper.make_node("MatMul", ["xg", "w"], ["y"])]
    path = _save_graph(tmp_path / "m.onnx", nodes, [_vec("x", "n", 4), _vec("gain")], [_vec("y", "n", 4)], [w])
    report = quantize_qdq(
        path, {"x": _images(1, seed=0).reshape(-1, 4)[:8], "gain": np.array(2.0)}, tmp_path / "q.onnx"
    )
    assert report.op_types == {"MatMul": 1} and report.calibration_samples == 8


def test_incomplete_symbolic_shape_inference_leaves_nothing_in_the_cwd(tmp_path: Path, monkeypatch, caplog) -> None:
    """Symbolic shape inference cannot tell whether the dynamic first dims of x and y agree, so it stays
    incomplete; ONNX Runtime's own entry point then saves its partial model and a data file to the cwd."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32), "w")
    nodes = [
        onnx.helper.make_node("Add", ["x", "y"], ["s"], name="mix"),
        onnx.helper.make_node("MatMul", ["s", "w"], ["z"], name="proj"),
    ]
    path = _save_graph(tmp_path / "m.onnx", nodes, [_vec("x", "n", 32), _vec("y", "m", 32)], [_vec("z", "n", 32)], [w])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    caplog.set_level("INFO", logger="worker.int8.quantize.preprocess")
    rng = np.random.default_rng(1)
    samples = {name: rng.standard_normal((8, 32)).astype(np.float32) for name in ("x", "y")}
    report = quantize_qdq(path, samples, tmp_path / "q.onnx")
    assert "Incomplete symbolic shape inference" in caplog.text
    assert report.preprocessed and report.op_types == {"MatMul": 1}
    assert list(cwd.iterdir()) == []


def test_initializers_listed_as_inputs_are_weights(tmp_path: Path) -> None:
    """Before IR 4 every initializer is also a graph input; TensorRT takes them as weights, and so does Q/DQ."""
    model = conv_net(seed=2)
    model.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "q.onnx"
    report = quantize_qdq(path, {"input": _images(8, seed=1)}, out)
    assert report.op_types == {"Conv": 2, "MatMul": 1}
    quantized = onnx.load(str(out))
    assert [i.name for i in quantized.graph.input] == ["input", "conv0.b", "conv1.b"]  # biases stay float
    _assert_tensorrt_placement(quantized)


def test_the_output_check_refuses_a_dequantized_constant_outside_weighted_ops() -> None:
    """What ONNX Runtime's quantizer made of YOLOv8's anchor offset (Add of 0.5) and BERT's GELU (Add of 1.0)."""
    inits = [
        numpy_helper.from_array(np.array(127, np.int8), "half_quantized"),
        numpy_helper.from_array(np.array(0.5 / 127, np.float32), "half_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "half_zero_point"),
    ]
    nodes = [
        onnx.helper.make_node(
            "DequantizeLinear",
            ["half_quantized", "half_scale", "half_zero_point"],
            ["half"],
            name="half_DequantizeLinear",
        ),
        onnx.helper.make_node("Add", ["x", "half"], ["y"], name="shift"),
    ]
    graph = onnx.helper.make_graph(nodes, "g", [_vec("x", "n", 4)], [_vec("y", "n", 4)], inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(BuildFailed, match="'half_DequantizeLinear' before Add 'shift'"):
        check_for_tensorrt(model)


def test_samples_that_are_all_zeros_leave_nothing_to_quantize(fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="calibration samples are all zeros"):
        quantize_qdq(fp32, {"input": np.zeros((4, 3, 32, 32), np.float32)}, tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


# --------------------------------------------------------------------------- the CPU recipe on a real conv net


def test_the_cpu_artifact_of_a_real_conv_net_runs_integer_kernels(tmp_path: Path) -> None:
    """PP-OCR's text-direction classifier (a real MobileNet-style net, opset 11) through the onnxruntime recipe and
    the CPU build stage: the graph ONNX Runtime actually runs (its optimized model, at the level the runner uses)
    computes every convolution in an integer kernel, and stays close to fp32."""
    from enginefarm.core.domain import Target
    from enginefarm.core.spec import BuildSpec
    from enginefarm.measure.ort_runner import optimization_level
    from tests.realmodels import MODELS, path, samples
    from worker.backends import BuildLog
    from worker.pipeline import engine_from_model

    source = path("ppocr-cls")
    convs = sum(1 for n in onnx.load(str(source)).graph.node if n.op_type == "Conv")
    q = tmp_path / "int8.onnx"
    report = quantize_qdq(source, samples("ppocr-cls", 8, seed=1), q, family="onnxruntime", method="percentile")
    assert report.family == "onnxruntime" and report.options["quant_format"] == "QOperator"
    spec = BuildSpec(**{**MODELS["ppocr-cls"].shapes, "precision": "int8"})
    (tmp_path / "build").mkdir()
    built = engine_from_model(q, spec, Target.parse("onnxruntime/cpu-x86_64"), None, tmp_path / "build", BuildLog())
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization_level(ort, built.path)[0]  # as worker/measure/evaluate.py's runner
    options.optimized_model_filepath = str(tmp_path / "runs.onnx")
    session = ort.InferenceSession(str(built.path), options, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "runs.onnx")).graph.node]
    assert ran.count("QLinearConv") == convs > 0 and "Conv" not in ran and "FusedConv" not in ran, sorted(set(ran))
    feed = samples("ppocr-cls", 4, seed=9)
    got = session.run(None, feed)[0]
    want = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert _metrics(want, got)["cosine"] > 0.99


@pytest.mark.parametrize("family", ["onnxruntime", "tensorrt"])
def test_int8_keeps_the_named_layers_and_op_types_in_float(fp32: Path, tmp_path: Path, family: str) -> None:
    out = tmp_path / "q.onnx"
    report = quantize_qdq(
        fp32, {"input": _images(4, seed=1)}, out, family=family, keep_fp32_layers=["conv1"], keep_fp32_ops=["MatMul"]
    )
    graph = onnx.load(str(out)).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    floats = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    conv1 = next(n for n in graph.node if n.name == "conv1")
    fc = next(n for n in graph.node if n.name == "fc")
    for node in (conv1, fc):  # float kernels with their float weights
        assert node.op_type in ("Conv", "MatMul") and node.input[1] in floats, node
    if family == "tensorrt":  # and no Q/DQ in front of them for TensorRT to fuse into int8
        assert not dequantized.intersection([*conv1.input, *fc.input])
    # The other convolution is still int8: an integer kernel (ONNX Runtime) or fed by DequantizeLinear (TensorRT).
    conv0 = next(n for n in graph.node if n.name in ("conv0", "conv0_quant"))
    assert conv0.op_type == "QLinearConv" or dequantized.intersection(conv0.input), conv0
    assert report.options["kept_float"] == ["conv1", "fc"]


def test_int8_refuses_a_kept_layer_the_model_does_not_have(fp32: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecInvalid, match="keep_fp32_layers names nodes the model does not have: \\['nope'\\]"):
        quantize_qdq(fp32, {"input": _images(4, seed=1)}, tmp_path / "q.onnx", keep_fp32_layers=["nope"])
    assert not (tmp_path / "q.onnx").exists()
