"""Int8 Q/DQ quantization: the sample conv net calibrated on seeded data, checked for TensorRT's
symmetric int8 rules and for its accuracy against FP32 on held-out inputs; and bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from enginefarm.errors import BuildFailed, SpecInvalid
from enginefarm.modelfile import inspect_upload
from enginefarm.samples import conv_net, save_conv_net
from worker import quantize as Q
from worker.quantize import QuantizeReport, quantize_qdq

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
    assert report.method == "onnxruntime static QDQ, MinMax, per-channel, symmetric int8"
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
    assert report.method.split(", ")[1] == method.capitalize()
    scales, minmax = _scales(out), _scales(quantized[0])
    assert any(not np.allclose(scales[k], minmax[k]) for k in minmax), "ranges identical to MinMax"
    x = _images(HELD_OUT, seed=1234)
    m = _metrics(_run(fp32, x), _run(out, x))
    _report(method, m)
    assert m["cosine"] > 0.99


@pytest.mark.parametrize("batch, chunk", [(5, Q._CHUNK_BATCHES), (1, 3)])
def test_batching_does_not_change_minmax_ranges(
    fp32: Path, quantized, tmp_path: Path, monkeypatch, batch: int, chunk: int
) -> None:
    """Neither the calibration batch nor merging ranges chunk by chunk moves a MinMax range."""
    monkeypatch.setattr(Q, "_CHUNK_BATCHES", chunk)
    out, _ = quantized
    batched = tmp_path / "batched.onnx"
    report = quantize_qdq(fp32, {"input": _images(CALIBRATION, seed=1)}, batched, calibration_batch=batch)
    assert report.calibration_samples == CALIBRATION
    a = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(batched)).graph.initializer}
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, err_msg=name)


def test_per_tensor_weights(fp32: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, {"input": _images(8, seed=1)}, out, per_channel=False)
    assert report.method == "onnxruntime static QDQ, MinMax, per-tensor, symmetric int8"
    inits = {t.name: t for t in onnx.load(str(out)).graph.initializer}
    assert list(inits["conv0.w_scale"].dims) == [] and list(inits["fc.w_scale"].dims) == []


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

    monkeypatch.setattr(Q, "quant_pre_process", broken)
    before = sorted(p.name for p in fp32.parent.iterdir())
    out = tmp_path / "q.onnx"
    report = quantize_qdq(fp32, {"input": _images(8, seed=1)}, out, scratch=tmp_path / "scratch")
    assert not report.preprocessed
    assert "shape inference exploded" in (report.preprocess_error or "")
    assert report.op_types["Conv"] == 2 and report.op_types["MatMul"] == 1
    assert sorted(p.name for p in fp32.parent.iterdir()) == before  # nothing written beside the input
    assert list((tmp_path / "scratch").iterdir()) == []  # the work folder is removed


def test_large_models_use_external_data(fp32: Path, quantized, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Q, "_INLINE_LIMIT", 1024)
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


@pytest.mark.parametrize("bad, words", [
    (np.full((2, 3, 32, 32), "x"), "give real numbers"),
    (np.zeros((2, 3, 32, 32), np.complex64), "give real numbers"),
    (np.full((2, 3, 32, 32), np.nan, np.float32), "NaN or infinity"),
])
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
    from worker.backends import onnxruntime as backend
    from worker.evaluate import OrtRunner

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
