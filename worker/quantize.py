"""Int8 Q/DQ quantization of a float ONNX model from calibration samples, with ONNX Runtime.

TensorRT and TensorRT-RTX build int8 engines only from explicit QuantizeLinear/DequantizeLinear
nodes, so a float upload asked to build int8 is first turned into a Q/DQ model here and stored as a
derived model. TensorRT accepts only symmetric int8 (zero points 0) and no int32 bias
DequantizeLinear, which fixes the quantizer's settings: QInt8 activations and weights, symmetric
ranges, per-channel weights, float bias. The result also runs on ONNX Runtime CPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto, helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
)
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
from onnxruntime.quantization.shape_inference import quant_pre_process

from enginefarm.errors import BuildFailed, SpecInvalid

try:  # calibration caches let us calibrate with our own settings, then hand the ranges to quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data
except ImportError:  # older onnxruntime: quantize_static calibrates with its defaults
    save_tensors_data = None

log = logging.getLogger(__name__)

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops whose second input is a weight: quantized only when both data inputs come through Q/DQ.
_WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
# A protobuf message cannot exceed 2 GiB; leave room for the graph itself beside the weights.
_INLINE_LIMIT = (1 << 31) - (64 << 20)
# Calibrators keep every batch's intermediate tensors until they merge them: merge every this many.
_CHUNK_BATCHES = 32
# ORT's entropy default (128 bins for 128 quantized bins) leaves one candidate threshold, the full
# range, which is MinMax again; 2048 bins is the histogram TensorRT's own entropy calibrator uses.
_ENTROPY_BINS = 2048
_ENTROPY_QUANTIZED_BINS = 128


@dataclass
class QuantizeReport:
    """What the quantizer did, stored with the derived model so its provenance is visible."""

    method: str
    calibration_samples: int
    quantized_nodes: int  # QuantizeLinear + DequantizeLinear nodes in the output
    op_types: dict[str, int]  # op type -> count of nodes that compute on dequantized inputs
    preprocessed: bool
    onnxruntime_version: str
    preprocess_error: str | None = None  # why pre-processing was skipped, when it failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Input:
    """A graph input as calibration needs it: name, element type and dims (int or None if dynamic)."""

    name: str
    elem_type: int
    dims: tuple[int | None, ...] | None  # None: the model gives no shape

    @property
    def splittable(self) -> bool:
        """Samples stack along axis 0 only where the model takes a variable or size-1 first dim."""
        return bool(self.dims) and self.dims[0] in (None, 1)


class _SampleReader(CalibrationDataReader):
    """Feeds the samples to ORT's calibrator in batches along axis 0; whole arrays every batch."""

    def __init__(self, split: dict[str, np.ndarray], whole: dict[str, np.ndarray], count: int, batch: int):
        self._split, self._whole, self._count, self._batch = split, whole, count, batch
        self._starts: Iterator[int] = iter(())
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        start = next(self._starts, None)
        if start is None:
            return None
        feed = {name: a[start : start + self._batch] for name, a in self._split.items()}
        feed.update(self._whole)
        return feed

    def rewind(self) -> None:
        self._starts = iter(range(0, self._count, self._batch))

    def __len__(self) -> int:
        return -(-self._count // self._batch)

    def take(self, batches: int) -> list[dict[str, np.ndarray]]:
        """Return up to ``batches`` next batches; empty when the samples are used up."""
        out = []
        while len(out) < batches and (feed := self.get_next()) is not None:
            out.append(feed)
        return out


class _ListReader(CalibrationDataReader):
    """A few batches at a time for a calibrator, which holds all it reads until it merges them."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


# --------------------------------------------------------------------------- validation


def _problem(loc: list[Any], msg: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg}


def _model_inputs(model: ModelProto) -> list[_Input]:
    """Return the graph inputs that need data (initializers listed as inputs have defaults)."""
    weights = {t.name for t in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        if value.type.WhichOneof("value") != "tensor_type":
            inputs.append(_Input(value.name, TensorProto.UNDEFINED, None))
            continue
        ttype = value.type.tensor_type
        dims = None
        if ttype.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in ttype.shape.dim)
        inputs.append(_Input(value.name, ttype.elem_type, dims))
    return inputs


def _dims_text(dims: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _coerce(inp: _Input, value: Any, problems: list[dict[str, Any]]) -> np.ndarray | None:
    """Return the samples as a contiguous array of the input's dtype, or record why that is impossible."""
    loc = ["samples", inp.name]
    type_name = TensorProto.DataType.Name(inp.elem_type)
    try:
        target = np.dtype(helper.tensor_dtype_to_np_dtype(inp.elem_type))
    except (KeyError, TypeError, ValueError):
        problems.append(_problem(loc, f"model input {inp.name!r} has type {type_name}, which calibration cannot feed"))
        return None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        problems.append(_problem(loc, f"samples for input {inp.name!r} are not an array: {exc}"))
        return None
    if array.dtype == target:
        return _check_finite(inp, np.ascontiguousarray(array), problems)
    what = f"samples for input {inp.name!r} are {array.dtype}, and the model takes {type_name}"
    if array.dtype.kind not in "biuf":
        problems.append(_problem(loc, f"{what}; give real numbers"))
        return None
    if inp.elem_type in _FLOAT_TYPES:
        with np.errstate(over="ignore", invalid="ignore"):
            return _check_finite(inp, np.ascontiguousarray(array.astype(target)), problems)
    if array.dtype.kind == "f" and not (np.all(np.isfinite(array)) and np.array_equal(array, np.round(array))):
        problems.append(_problem(loc, f"{what}; the values are not all whole numbers"))
        return None
    if target.kind in "iu":
        info = np.iinfo(target)
        if array.size and (array.min() < info.min or array.max() > info.max):
            problems.append(_problem(loc, f"{what}; values fall outside {info.min}..{info.max}"))
            return None
    elif target.kind == "b" and array.size and not np.isin(array, (0, 1)).all():
        problems.append(_problem(loc, f"{what}; only 0 and 1 convert to bool"))
        return None
    return np.ascontiguousarray(array.astype(target))


def _check_finite(inp: _Input, array: np.ndarray, problems: list[dict[str, Any]]) -> np.ndarray | None:
    """Reject NaN and infinity: one of them would make every calibrated range meaningless."""
    if array.dtype.kind == "f" and array.size and not np.all(np.isfinite(array)):
        problems.append(_problem(["samples", inp.name], f"samples for input {inp.name!r} contain NaN or infinity"))
        return None
    return array


def _check_shape(inp: _Input, array: np.ndarray, problems: list[dict[str, Any]]) -> bool:
    """Check rank and fixed dims; axis 0 of a splittable input counts samples, so it is free."""
    loc = ["samples", inp.name]
    if inp.dims is None:
        return True
    shape = _dims_text(tuple(array.shape))
    if array.ndim != len(inp.dims):
        problems.append(_problem(loc, (
            f"samples for input {inp.name!r} have rank {array.ndim} (shape {shape}), but the model takes rank "
            f"{len(inp.dims)} {_dims_text(inp.dims)}; stack samples along axis 0 of that shape")))
        return False
    if inp.splittable:
        if array.shape[0] == 0:
            msg = f"input {inp.name!r} has 0 calibration samples; give at least 1 along axis 0"
            problems.append(_problem(loc, msg))
            return False
    elif inp.dims[0] is not None and array.shape[0] != inp.dims[0]:
        problems.append(_problem(loc, (
            f"input {inp.name!r} has a fixed first dim of {inp.dims[0]}, so its samples cannot be split along "
            f"axis 0; give one array of shape {_dims_text(inp.dims)}, not {shape}")))
        return False
    for axis in range(1, len(inp.dims)):
        want = inp.dims[axis]
        if want is not None and array.shape[axis] != want:
            problems.append(_problem(loc, (
                f"samples for input {inp.name!r} have shape {shape}, but the model fixes dim {axis} "
                f"to {want} {_dims_text(inp.dims)}")))
            return False
    return True


def _validate(
    inputs: list[_Input], samples: Mapping[str, Any], calibration_batch: int
) -> tuple[_SampleReader, int]:
    """Check the samples against the model's inputs; return the reader and the sample count."""
    problems: list[dict[str, Any]] = []
    if not isinstance(samples, Mapping):
        raise SpecInvalid("calibration samples must map input names to arrays",
                          problems=[_problem(["samples"], "not a mapping of input name to array")])
    names = [i.name for i in inputs]
    for name in samples:
        if name not in names:
            problems.append(_problem(["samples", str(name)], (
                f"{name!r} is not an input of the model; its inputs are {', '.join(map(repr, names))}")))
    arrays: dict[str, np.ndarray] = {}
    for inp in inputs:
        if inp.name not in samples:
            problems.append(_problem(["samples", inp.name], f"no calibration samples for model input {inp.name!r}"))
            continue
        array = _coerce(inp, samples[inp.name], problems)
        if array is not None and _check_shape(inp, array, problems):
            arrays[inp.name] = array
    split = {i.name: arrays[i.name] for i in inputs if i.splittable and i.name in arrays}
    counts = {name: a.shape[0] for name, a in split.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{n!r}: {c}" for n, c in counts.items())
        msg = f"inputs hold different numbers of samples along axis 0 ({listed})"
        problems.append(_problem(["samples"], msg))
    if problems:
        detail = "; ".join(p["msg"] for p in problems)
        raise SpecInvalid(f"calibration samples do not fit the model: {detail}", problems=problems)
    whole = {name: a for name, a in arrays.items() if name not in split}
    count = next(iter(counts.values()), 1)
    # A size-1 first dim pins the model's batch, so every input is fed one sample at a time.
    batch = 1 if any(i.dims and i.dims[0] == 1 for i in inputs if i.name in split) else calibration_batch
    return _SampleReader(split, whole, count, batch), count


def _check_options(method: str, calibration_batch: int) -> CalibrationMethod:
    problems = []
    calibrate = METHODS.get(method.lower()) if isinstance(method, str) else None
    if calibrate is None:
        msg = f"unknown calibration method {method!r}; use one of {', '.join(METHODS)}"
        problems.append(_problem(["method"], msg))
    if isinstance(calibration_batch, bool) or not isinstance(calibration_batch, int) or calibration_batch < 1:
        msg = f"calibration_batch must be an integer >= 1, not {calibration_batch!r}"
        problems.append(_problem(["calibration_batch"], msg))
    if problems:
        raise SpecInvalid("; ".join(p["msg"] for p in problems), problems=problems)
    return calibrate  # type: ignore[return-value]


# --------------------------------------------------------------------------- model files


def _load_graph(model_path: Path) -> ModelProto:
    """Parse and check the float model (weights stay on disk); any failure is final for the build."""
    try:
        model = onnx.load(str(model_path), format="protobuf", load_external_data=False)
        onnx.checker.check_model(str(model_path))
    except FileNotFoundError:
        raise BuildFailed(f"model file {model_path} does not exist") from None
    except (DecodeError, OSError, ValueError, RuntimeError, UnicodeDecodeError, onnx.checker.ValidationError) as exc:
        raise BuildFailed(f"cannot quantize: the model does not load as ONNX ({exc})") from None
    if any(n.op_type in _QDQ_OPS for n in model.graph.node):
        raise BuildFailed("the model already holds QuantizeLinear/DequantizeLinear nodes; build int8 from it as it is")
    return model


def _stored_bytes(model_path: Path, model: ModelProto) -> int:
    """Size on disk of the model file plus each external data file it names."""
    files = {
        entry.value
        for t in model.graph.initializer
        for entry in t.external_data
        if entry.key == "location"
    }
    return model_path.stat().st_size + sum((model_path.parent / f).stat().st_size for f in files
                                           if (model_path.parent / f).is_file())


def _tensor_bytes(model: ModelProto) -> int:
    return sum(t.ByteSize() for t in model.graph.initializer)


def _save(model: ModelProto, path: Path, external: bool) -> None:
    """Write one .onnx file, or the graph plus ``<name>.data`` beside it when weights pass 2 GiB."""
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)


def _preprocess(model_path: Path, work: Path, large: bool) -> tuple[Path | None, str | None]:
    """Run ORT's shape inference and graph cleanup; return the result, or None and why it failed."""
    out = work / "preprocessed.onnx"
    # Symbolic shape inference needs sympy; ONNX shape inference and the graph cleanup do not.
    symbolic = importlib.util.find_spec("sympy") is not None
    try:
        quant_pre_process(str(model_path), str(out), skip_symbolic_shape=not symbolic, save_as_external_data=large,
                          all_tensors_to_one_file=True, external_data_location="preprocessed.onnx.data")
        onnx.checker.check_model(str(out))
    except Exception as exc:  # noqa: BLE001 - any failure only means quantizing the raw model
        log.warning("quantization pre-processing failed, quantizing the model as uploaded: %s", exc)
        return None, f"{type(exc).__name__}: {exc}"
    return out, None


def _stage_raw(model_path: Path, work: Path, large: bool) -> Path:
    """Copy the model into the work folder: the quantizer writes scratch files beside its input."""
    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(f"cannot quantize: the model's weights do not load ({exc})") from None
    staged = work / "model.onnx"
    _save(model, staged, large)
    return staged


# --------------------------------------------------------------------------- calibration


def _calibrate(source: Path, reader: _SampleReader, calibrate: CalibrationMethod, work: Path, large: bool) -> Path:
    """Collect symmetric ranges chunk by chunk (bounded memory); return them as a calibration cache."""
    options: dict[str, Any] = {"symmetric": True}
    if calibrate == CalibrationMethod.Entropy:
        options.update(num_bins=_ENTROPY_BINS, num_quantized_bins=_ENTROPY_QUANTIZED_BINS)
    chatter = io.StringIO()  # the histogram calibrators print their progress
    with contextlib.redirect_stdout(chatter):
        # The tensors quantize_static itself would calibrate: those of the ops it can quantize.
        op_types = sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
        calibrator = create_calibrator(source, op_types, augmented_model_path=str(work / "augmented.onnx"),
                                       calibrate_method=calibrate, use_external_data_format=large,
                                       extra_options=options)
        reader.rewind()
        while feeds := reader.take(_CHUNK_BATCHES):
            calibrator.collect_data(_ListReader(feeds))
        ranges = calibrator.compute_data()
    log.debug("calibration: %s", chatter.getvalue().strip())
    cache = work / "calibration.json"
    save_tensors_data(ranges, cache)
    reader.rewind()
    return cache


# --------------------------------------------------------------------------- output checks


def _initializer(model: ModelProto, name: str) -> TensorProto | None:
    return next((t for t in model.graph.initializer if t.name == name), None)


def _check_symmetric(model: ModelProto) -> None:
    """Guarantee what TensorRT requires of every Q/DQ node: an int8 zero point equal to 0."""
    for node in model.graph.node:
        if node.op_type not in _QDQ_OPS:
            continue
        zp = _initializer(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zp is None or zp.data_type != TensorProto.INT8 or np.any(onnx.numpy_helper.to_array(zp)):
            raise BuildFailed(f"quantizer produced {node.op_type} {node.name!r} without a zero int8 zero point")


def _quantized_op_types(model: ModelProto) -> dict[str, int]:
    """Count nodes computing on dequantized data: weighted ops need both data and weight through Q/DQ."""
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        if node.op_type in _QDQ_OPS or not node.input:
            continue
        needed = node.input[:2] if node.op_type in _WEIGHTED_OPS else node.input[:1]
        if all(name in dequantized for name in needed):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def _verify(out_path: Path) -> None:
    """The written file must pass the checker and open in ORT CPU; else remove it, so nothing stores it."""
    try:
        onnx.checker.check_model(str(out_path))
        ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        _remove_output(out_path)
        raise BuildFailed(f"the quantized model does not load: {exc}") from None


def _remove_output(out_path: Path) -> None:
    out_path.unlink(missing_ok=True)
    out_path.with_name(out_path.name + ".data").unlink(missing_ok=True)


# --------------------------------------------------------------------------- entry point


def quantize_qdq(
    model_path: Path,
    samples: dict[str, np.ndarray],
    out_path: Path,
    *,
    method: str = "minmax",
    calibration_batch: int = 1,
    per_channel: bool = True,
    scratch: Path | None = None,
) -> QuantizeReport:
    """Write a symmetric int8 Q/DQ version of ``model_path`` calibrated on ``samples`` to ``out_path``.

    ``samples`` maps each model input to an array stacking samples along axis 0; inputs whose first
    dim is fixed to something other than 1 take one whole array. Bad samples or options raise
    ``SpecInvalid``; a model that does not load or quantize raises ``BuildFailed``.
    """
    model_path, out_path = Path(model_path), Path(out_path)
    calibrate = _check_options(method, calibration_batch)
    model = _load_graph(model_path)
    reader, count = _validate(_model_inputs(model), samples, calibration_batch)
    large = _stored_bytes(model_path, model) >= _INLINE_LIMIT
    del model

    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="quantize-", dir=scratch))
    try:
        source, pre_error = _preprocess(model_path, work, large)
        if source is None:
            source = _stage_raw(model_path, work, large)
        raw_out = work / "quantized.onnx"
        try:
            cached: dict[str, str] = {}
            if save_tensors_data is not None:
                cached["calibration_cache_path"] = str(_calibrate(source, reader, calibrate, work, large))
            quantize_static(
                str(source), str(raw_out), reader,
                quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                per_channel=per_channel,
                reduce_range=False,
                calibrate_method=calibrate,
                use_external_data_format=large,
                extra_options={
                    "ActivationSymmetric": True,
                    "WeightSymmetric": True,
                    "CalibTensorRangeSymmetric": True,
                    # TensorRT's parser takes no DequantizeLinear on int32; it fuses the float bias itself.
                    "QuantizeBias": False,
                    "CalibMaxIntermediateOutputs": _CHUNK_BATCHES,
                },
                **cached,
            )
            quantized = onnx.load(str(raw_out))
        except (SpecInvalid, BuildFailed):
            raise
        except Exception as exc:  # noqa: BLE001 - ORT raises many types; all mean this model cannot be done
            raise BuildFailed(f"int8 quantization failed: {type(exc).__name__}: {exc}") from None
        _check_symmetric(quantized)
        qdq = sum(1 for n in quantized.graph.node if n.op_type in _QDQ_OPS)
        if not qdq:
            raise BuildFailed("the model has no operators ONNX Runtime can quantize (such as Conv, MatMul, Gemm)")
        op_types = _quantized_op_types(quantized)
        try:
            _save(quantized, out_path, _tensor_bytes(quantized) >= _INLINE_LIMIT)
        except BaseException:
            _remove_output(out_path)
            raise
        del quantized
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _verify(out_path)

    granularity = "per-channel" if per_channel else "per-tensor"
    return QuantizeReport(
        method=f"onnxruntime static QDQ, {calibrate.name}, {granularity}, symmetric int8",
        calibration_samples=count,
        quantized_nodes=qdq,
        op_types=op_types,
        preprocessed=pre_error is None,
        onnxruntime_version=ort.__version__,
        preprocess_error=pre_error,
    )
