"""Raising a model older than opset 13 to opset 13, the first where DequantizeLinear takes a per-channel axis,
and checking that the converted model still computes what the original does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from enginefarm.core.errors import BuildFailed
from worker.int8.quantize.samples import SampleReader
from worker.rewrite.onnxgraph import default_opset, save_model

# DequantizeLinear has an axis (per-channel scales) from opset 13; TensorRT parses Q/DQ from there on.
_MIN_OPSET = 13
# IR version 7 is the first that opset 13 belongs to; it also lets initializers stay off the graph inputs.
_MIN_IR = 7
# An opset conversion must not change what the model computes: relative L2 of every output at most this.
_CONVERSION_TOLERANCE = 1e-4


def raise_opset(model_path: Path, work: Path, large: bool, reader: SampleReader) -> tuple[Path, int | None]:
    """Convert a model older than opset 13 to opset 13; return the file to go on with and the old opset.

    Before opset 13 DequantizeLinear has no ``axis`` (TensorRT: "Unrecognized attribute: axis for operator
    DequantizeLinear"), and a bare opset bump would change what Softmax, Split, Squeeze and others mean, so
    ONNX's version converter rewrites the graph. The converted model must give the original's outputs on a
    calibration batch, or the build fails rather than quantize a different model.
    """
    model = onnx.load(str(model_path), load_external_data=False)
    have = default_opset(model, missing=0)
    if have >= _MIN_OPSET:
        return model_path, None
    why = (
        f"int8 Q/DQ for TensorRT needs ONNX opset {_MIN_OPSET} or later (per-channel DequantizeLinear takes "
        f"an axis from opset {_MIN_OPSET} on), and the model has opset {have}"
    )
    instead = f"upload the model exported at opset {_MIN_OPSET} or later, or build fp16 for it instead"
    try:
        converted = onnx.version_converter.convert_version(model, _MIN_OPSET)
        converted.ir_version = max(converted.ir_version, _MIN_IR)
        onnx.load_external_data_for_model(converted, str(model_path.parent))
        out = work / f"opset{_MIN_OPSET}.onnx"
        save_model(converted, out, external=large)
        del converted, model
        onnx.checker.check_model(str(out))
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors and more
        raise BuildFailed(f"{why}; converting it failed ({type(exc).__name__}: {exc}); {instead}") from None
    reader.rewind()
    feeds = reader.take(1)
    reader.rewind()
    try:
        before = _run(model_path, feeds[0])
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(
            f"cannot quantize: the model does not run on ONNX Runtime's CPU provider with the first "
            f"calibration sample ({type(exc).__name__}: {exc})"
        ) from None
    try:
        after = _run(out, feeds[0])
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(
            f"{why}; the model converted to opset {_MIN_OPSET} does not run on a calibration "
            f"sample ({type(exc).__name__}: {exc}); {instead}"
        ) from None
    for name, ref in before.items():
        error = _relative_error(ref, after[name])
        if error > _CONVERSION_TOLERANCE:
            raise BuildFailed(
                f"{why}; converted to opset {_MIN_OPSET} its output {name!r} differs from the "
                f"original's (relative L2 {error:.3g}); {instead}"
            )
    return out, have


def _run(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _relative_error(ref: Any, got: Any) -> float:
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return float("inf")
    if ref.dtype.kind not in "fc":
        return 0.0 if np.array_equal(ref, got) else float("inf")
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    if not np.array_equal(np.isnan(ref), np.isnan(got)):
        return float("inf")
    ref, got = np.nan_to_num(ref), np.nan_to_num(got)
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(got - ref)
    return float(diff / norm) if norm else float(diff)
