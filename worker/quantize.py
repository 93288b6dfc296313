"""Int8 Q/DQ quantization of a float ONNX model from calibration samples, placed the way TensorRT wants it.

TensorRT and TensorRT-RTX build int8 engines only from explicit QuantizeLinear/DequantizeLinear
nodes, so a float upload asked to build int8 is first turned into a Q/DQ model here and stored as a
derived model. The placement follows NVIDIA's Q/DQ recommendations for TensorRT rather than ONNX
Runtime's own quantizer, whose output TensorRT rejects on real models:

- Only the inputs of weighted operations get Q/DQ: Conv, ConvTranspose, and MatMul/Gemm with a
  constant weight. Activations are quantized per tensor (QuantizeLinear -> DequantizeLinear),
  weights are stored as int8 and dequantized per output channel. A MatMul of two computed tensors
  (attention) is not a weighted operation and stays in float: per-tensor ranges of attention
  probabilities cost accuracy, for a speed-up that depends on TensorRT's int8 attention kernels.
- The residual input of an Add that follows a quantized Conv is quantized too, so TensorRT can fuse
  the addition into the int8 convolution (NVIDIA's "quantize the residual input" recommendation).
  Outputs of weighted operations are not quantized, and nothing else is: elementwise ops, pooling,
  resizes and reshapes stay as they are, and TensorRT propagates Q/DQ across the ops that commute
  with quantization (max pooling, reshapes, transposes) by itself.
- An int8 constant only ever feeds a DequantizeLinear (TensorRT: "Quantized constant ... is only
  allowed before DQ"); a weight shared with an operation that is not quantized keeps its float copy.
- Symmetric int8 (zero points 0), float scales, float bias (no int32 bias DequantizeLinear).
- Per-channel DequantizeLinear takes an axis from ONNX opset 13 on, so an older model is converted
  to opset 13 first (ONNX Runtime's quantizer leaves it at its opset and writes the axis anyway), and
  the conversion is checked to give the same outputs.

ONNX Runtime does the pre-processing (shape inference, constant folding) and the calibration
(MinMax, entropy or percentile ranges on the user's samples); the result also runs on its CPU provider.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod
from onnxruntime.quantization.calibrate import EntropyCalibrater, MinMaxCalibrater, PercentileCalibrater
from onnxruntime.quantization.shape_inference import quant_pre_process

from enginefarm.errors import BuildFailed, SpecInvalid

log = logging.getLogger(__name__)

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# The weighted operations TensorRT runs in int8 when their inputs come through Q/DQ.
_WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# The only operations a DequantizeLinear may feed in our output: the weighted ones, and residual Adds.
_QUANTIZED_OPS = frozenset({*_WEIGHTED_OPS, "Add"})
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
# DequantizeLinear has an axis (per-channel scales) from opset 13; TensorRT parses Q/DQ from there on.
_MIN_OPSET = 13
# IR version 7 is the first that opset 13 belongs to; it also lets initializers stay off the graph inputs.
_MIN_IR = 7
# Symmetric int8: amax maps to 127, zero point 0 (TensorRT's scheme).
_QMAX = 127
# A protobuf message cannot exceed 2 GiB; leave room for the graph itself beside the weights.
_INLINE_LIMIT = (1 << 31) - (64 << 20)
# Calibrators keep every batch's intermediate tensors until they merge them: merge every this many.
_CHUNK_BATCHES = 32
# ORT's entropy default (128 bins for 128 quantized bins) leaves one candidate threshold, the full
# range, which is MinMax again; 2048 bins is the histogram TensorRT's own entropy calibrator uses.
_ENTROPY_BINS = 2048
_ENTROPY_QUANTIZED_BINS = 128
_PERCENTILE_BINS = 2048
_PERCENTILE = 99.999
# An opset conversion must not change what the model computes: relative L2 of every output at most this.
_CONVERSION_TOLERANCE = 1e-4
# How many skipped nodes the report names one by one.
_REPORT_SKIPPED = 100


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
    opset: int = 0  # the output's default-domain opset
    opset_converted_from: int | None = None  # the upload's opset, when it had to be raised
    skipped: dict[str, str] = field(default_factory=dict)  # weighted node left in float -> why

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
        return _check_finite(inp, np.asarray(array, order="C"), problems)
    what = f"samples for input {inp.name!r} are {array.dtype}, and the model takes {type_name}"
    if array.dtype.kind not in "biuf":
        problems.append(_problem(loc, f"{what}; give real numbers"))
        return None
    if inp.elem_type in _FLOAT_TYPES:
        with np.errstate(over="ignore", invalid="ignore"):
            return _check_finite(inp, np.asarray(array.astype(target), order="C"), problems)
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
    return np.asarray(array.astype(target), order="C")


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
    elif inp.dims and inp.dims[0] is not None and array.shape[0] != inp.dims[0]:
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
    if any(n.op_type in _QDQ_OPS for n in _all_nodes(model.graph)):
        raise BuildFailed("the model already holds QuantizeLinear/DequantizeLinear nodes; build int8 from it as it is")
    return model


def _opset(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


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


def _raise_opset(model_path: Path, work: Path, large: bool, reader: _SampleReader) -> tuple[Path, int | None]:
    """Convert a model older than opset 13 to opset 13; return the file to go on with and the old opset.

    Before opset 13 DequantizeLinear has no ``axis`` (TensorRT: "Unrecognized attribute: axis for operator
    DequantizeLinear"), and a bare opset bump would change what Softmax, Split, Squeeze and others mean, so
    ONNX's version converter rewrites the graph. The converted model must give the original's outputs on a
    calibration batch, or the build fails rather than quantize a different model.
    """
    model = onnx.load(str(model_path), load_external_data=False)
    have = _opset(model)
    if have >= _MIN_OPSET:
        return model_path, None
    why = (f"int8 Q/DQ for TensorRT needs ONNX opset {_MIN_OPSET} or later (per-channel DequantizeLinear takes "
           f"an axis from opset {_MIN_OPSET} on), and the model has opset {have}")
    try:
        converted = onnx.version_converter.convert_version(model, _MIN_OPSET)
        converted.ir_version = max(converted.ir_version, _MIN_IR)
        onnx.load_external_data_for_model(converted, str(model_path.parent))
        out = work / f"opset{_MIN_OPSET}.onnx"
        _save(converted, out, large)
        del converted, model
        onnx.checker.check_model(str(out))
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors and more
        raise BuildFailed(f"{why}; converting it failed ({type(exc).__name__}: {exc}); "
                          f"upload the model exported at opset {_MIN_OPSET} or later, or build fp16 for it instead") from None
    reader.rewind()
    feeds = reader.take(1)
    reader.rewind()
    try:
        before = _run(model_path, feeds[0])
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(f"cannot quantize: the model does not run on ONNX Runtime's CPU provider with the first "
                          f"calibration sample ({type(exc).__name__}: {exc})") from None
    try:
        after = _run(out, feeds[0])
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(f"{why}; the model converted to opset {_MIN_OPSET} does not run on a calibration "
                          f"sample ({type(exc).__name__}: {exc}); upload the model exported at opset {_MIN_OPSET} or "
                          f"later, or build fp16 for it instead") from None
    for name, ref in before.items():
        error = _relative_error(ref, after[name])
        if error > _CONVERSION_TOLERANCE:
            raise BuildFailed(f"{why}; converted to opset {_MIN_OPSET} its output {name!r} differs from the "
                              f"original's (relative L2 {error:.3g}); upload the model exported at opset {_MIN_OPSET} or "
                              f"later, or build fp16 for it instead")
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


def _preprocess(model_path: Path, work: Path, large: bool) -> tuple[Path | None, str | None]:
    """Run ORT's shape inference and graph cleanup; return the result, or None and why it failed."""
    out = work / "preprocessed.onnx"
    # Symbolic shape inference needs sympy, and gives up on some dynamic models ("Incomplete symbolic
    # shape inference"); ONNX shape inference and the graph cleanup (constant folding) still help then.
    attempts = [True, False] if importlib.util.find_spec("sympy") is not None else [False]
    error = None
    for symbolic in attempts:
        (work / "preprocessed.onnx.data").unlink(missing_ok=True)  # onnx appends to an existing data file
        try:
            quant_pre_process(str(model_path), str(out), skip_symbolic_shape=not symbolic,
                              save_as_external_data=large, all_tensors_to_one_file=True,
                              external_data_location="preprocessed.onnx.data")
            onnx.checker.check_model(str(out))
            return out, None
        except Exception as exc:  # noqa: BLE001 - any failure only means quantizing the raw model
            error = f"{type(exc).__name__}: {exc}"
            log.info("quantization pre-processing (symbolic shapes: %s) failed: %s", symbolic, error)
    log.warning("quantization pre-processing failed, quantizing the model as uploaded: %s", error)
    return None, error


def _stage_raw(model_path: Path, work: Path, large: bool) -> Path:
    """Copy the model into the work folder: calibration writes scratch files beside its input."""
    try:
        model = onnx.load(str(model_path))
    except Exception as exc:  # noqa: BLE001
        raise BuildFailed(f"cannot quantize: the model's weights do not load ({exc})") from None
    staged = work / "model.onnx"
    _save(model, staged, large)
    return staged


# --------------------------------------------------------------------------- placement


def _all_nodes(graph: onnx.GraphProto) -> Iterator[NodeProto]:
    """Every node of the graph and of the subgraphs inside it (If branches, Loop and Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_nodes(g)


def _label(node: NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


@dataclass
class _Weight:
    """A constant weight of a weighted node, stored int8 and dequantized (per channel along ``axis``)."""

    name: str
    axis: int | None  # None: one scale for the tensor


@dataclass
class _Plan:
    """Which node inputs get Q/DQ: node index -> input slot -> the activation tensor's name (quantized per
    tensor through QuantizeLinear/DequantizeLinear) or a constant weight (stored int8, DequantizeLinear).
    Built before calibration, pruned once the ranges are known."""

    nodes: dict[int, dict[int, str | _Weight]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def activations(self) -> set[str]:
        return {t for slots in self.nodes.values() for t in slots.values() if isinstance(t, str)}

    def drop(self, index: int, label: str, why: str | None) -> None:
        """Leave a node in float; ``why`` goes to the report (None: not worth reporting)."""
        self.nodes.pop(index, None)
        if why is not None:
            self.skipped[label] = why


def _constants_to_initializers(model: ModelProto) -> None:
    """Turn Constant nodes that feed a weighted node into initializers, so their weights can be quantized."""
    graph = model.graph
    feeding = {name for n in graph.node if n.op_type in _WEIGHTED_OPS for name in n.input}
    keep = []
    for node in graph.node:
        value = next((a for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and node.output[0] in feeding:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value.t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)


def _weight_axis(node: NodeProto, slot: int, rank: int) -> int | None:
    """The output-channel axis of a weight, as TensorRT takes per-channel scales; None for per tensor."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        return 0  # [M, C/group, k...]
    if node.op_type == "ConvTranspose":
        return 1 if attrs.get("group", 1) == 1 else None  # [C, M/group, k...]
    if slot != 1 or rank < 2:
        return None  # a constant left operand or a vector: one scale
    if node.op_type == "Gemm":
        return 0 if attrs.get("transB", 0) else 1
    return rank - 1  # MatMul: [..., K, N], N are the output channels


def _plan(model: ModelProto, per_channel: bool) -> _Plan:
    """Choose the Q/DQ inputs: activations and weights of weighted nodes, residual inputs of their Adds."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    uses = Counter(name for n in _all_nodes(graph) for name in n.input)
    uses.update(o.name for o in graph.output)

    def constant(name: str) -> bool:
        # An initializer also listed as a graph input (all of them before IR 4) is a weight to TensorRT too.
        return name in inits

    plan = _Plan()
    for index, node in enumerate(graph.node):
        if node.op_type not in _WEIGHTED_OPS or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        label = _label(node, index)
        if node.op_type in ("Conv", "ConvTranspose"):
            act, slot = 0, 1
            if not constant(node.input[1]):
                plan.skipped[label] = "its weight is computed, not a constant"
                continue
        else:
            a, b = (constant(n) for n in node.input[:2])
            if a == b:
                plan.skipped[label] = ("both inputs are constants" if a else
                                       "both inputs are computed (no constant weight)")
                continue
            act, slot = (1, 0) if a else (0, 1)
        weight = inits[node.input[slot]]
        if weight.data_type != TensorProto.FLOAT:
            plan.skipped[label] = f"its weight is {TensorProto.DataType.Name(weight.data_type)}, not FLOAT"
            continue
        axis = _weight_axis(node, slot, len(weight.dims)) if per_channel else None
        plan.nodes[index] = {act: node.input[act], slot: _Weight(weight.name, axis)}

    convs = {i for i in plan.nodes if graph.node[i].op_type == "Conv"}
    for index, node in enumerate(graph.node):
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        if any(name in inits for name in node.input):
            continue  # a bias or a constant: no residual
        fused = [producer.get(name) in convs and uses[name] == 1 for name in node.input]
        if fused.count(True) == 1:  # the Conv output fuses; its partner, the residual, is quantized
            slot = fused.index(False)
            plan.nodes[index] = {slot: node.input[slot]}
    return plan


def _nested_weighted(model: ModelProto) -> list[tuple[str, str, int]]:
    """Control-flow nodes of the main graph holding weighted nodes in their subgraphs: name, op type, count."""
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type in _CONTROL_FLOW:
            holder = onnx.GraphProto()
            holder.node.append(node)
            count = sum(1 for n in _all_nodes(holder) if n.op_type in _WEIGHTED_OPS)
            if count:
                found.append((_label(node, index), node.op_type, count))
    return found


# --------------------------------------------------------------------------- calibration


def _calibrate(source: Path, tensors: Iterable[str], reader: _SampleReader, calibrate: CalibrationMethod,
               work: Path, large: bool) -> dict[str, float]:
    """Return each tensor's symmetric range (amax), collected chunk by chunk with bounded memory.

    Only FLOAT tensors whose type shape inference knows get a range; the others are left out.
    """
    common: dict[str, Any] = {"augmented_model_path": str(work / "augmented.onnx"),
                              "use_external_data_format": large, "symmetric": True}
    if calibrate == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(str(source), None, num_bins=_ENTROPY_BINS,
                                       num_quantized_bins=_ENTROPY_QUANTIZED_BINS, **common)
    elif calibrate == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(str(source), None, num_bins=_PERCENTILE_BINS, percentile=_PERCENTILE,
                                          **common)
    else:
        calibrator = MinMaxCalibrater(str(source), None, **common)
    wanted, base = set(tensors), calibrator.select_tensors_to_calibrate

    def select(model: ModelProto) -> tuple[set[str], dict[str, Any]]:
        _, infos = base(model)  # every tensor's value info, from shape inference
        constants = {t.name for t in model.graph.initializer}
        chosen = {name for name in wanted if name in infos and name not in constants
                  and infos[name].type.HasField("tensor_type")
                  and infos[name].type.tensor_type.elem_type == TensorProto.FLOAT}
        return chosen, infos

    calibrator.select_tensors_to_calibrate = select  # calibrate what gets Q/DQ, not every tensor
    chatter = io.StringIO()  # the histogram calibrators print their progress
    with contextlib.redirect_stdout(chatter):
        calibrator.augment_graph()
        calibrator.create_inference_session()
        reader.rewind()
        while feeds := reader.take(_CHUNK_BATCHES):
            calibrator.collect_data(_ListReader(feeds))
        ranges = calibrator.compute_data()
    log.debug("calibration: %s", chatter.getvalue().strip())
    reader.rewind()
    amax = {}
    for name, data in ranges.items():
        low, high = (float(np.max(np.abs(v))) for v in data.range_value)
        amax[name] = max(low, high)
    return amax


# --------------------------------------------------------------------------- Q/DQ insertion


class _Names:
    """Fresh tensor and node names, never clashing with the model's own."""

    def __init__(self, model: ModelProto):
        self._used = {t.name for t in model.graph.initializer}
        for node in _all_nodes(model.graph):
            self._used.update(node.input)
            self._used.update(node.output)
            self._used.add(node.name)
        self._used.update(v.name for v in (*model.graph.input, *model.graph.output, *model.graph.value_info))

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        return name


def _scale_of(amax: np.ndarray) -> np.ndarray:
    """Symmetric int8 scales; a channel that is all zeros gets scale 1 (any positive scale represents it)."""
    amax = np.asarray(amax, dtype=np.float64)
    return np.where(amax > 0, amax / _QMAX, 1.0).astype(np.float32)


def _quantize_weight(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (or per-tensor) symmetric int8 weights and their scales."""
    w = w.astype(np.float32)
    if axis is None:
        scale = _scale_of(np.max(np.abs(w)) if w.size else 0.0)
        return np.clip(np.rint(w / scale), -_QMAX, _QMAX).astype(np.int8), scale
    reduce = tuple(i for i in range(w.ndim) if i != axis)
    scale = _scale_of(np.max(np.abs(w), axis=reduce) if w.size else np.zeros(w.shape[axis]))
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -_QMAX, _QMAX).astype(np.int8)
    return q, scale


def _unusable(tensor: str | _Weight, amax: dict[str, float], inits: dict[str, TensorProto]) -> str | None:
    """Why an input cannot be quantized, or None."""
    if isinstance(tensor, _Weight):
        finite = np.all(np.isfinite(numpy_helper.to_array(inits[tensor.name])))
        return None if finite else f"weight {tensor.name!r} holds NaN or infinity"
    if tensor not in amax:
        return f"input {tensor!r} has no FLOAT type known to shape inference, so no range"
    if not np.isfinite(amax[tensor]):
        return f"input {tensor!r} reached NaN or infinity on the calibration samples"
    if amax[tensor] == 0:
        return f"input {tensor!r} was all zeros on the calibration samples"
    return None


def _prune(model: ModelProto, plan: _Plan, amax: dict[str, float]) -> None:
    """Leave in float every node whose activation got no usable range, or whose weight is not finite."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for index, slots in list(plan.nodes.items()):
        why = next((w for t in slots.values() if (w := _unusable(t, amax, inits))), None)
        if why is not None:
            plan.drop(index, _label(graph.node[index], index), why)
    # A residual Add whose Conv partner was left in float fuses nothing: leave it in float too.
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    for index in [i for i in plan.nodes if graph.node[i].op_type == "Add"]:
        node = graph.node[index]
        fused = next(name for slot, name in enumerate(node.input) if slot not in plan.nodes[index])
        if producer.get(fused) not in plan.nodes:
            plan.drop(index, _label(node, index), None)


def _insert_qdq(model: ModelProto, plan: _Plan, amax: dict[str, float]) -> dict[str, int]:
    """Rewrite the graph with the planned Q/DQ; return op type -> number of nodes now taking int8."""
    graph = model.graph
    names = _Names(model)
    inits = {t.name: t for t in graph.initializer}
    zero = np.zeros((), np.int8)
    dequantized: dict[str, str] = {}  # activation -> its DequantizeLinear output
    weights: dict[tuple[str, int | None], str] = {}  # (weight, axis) -> its DequantizeLinear output
    new_inits: list[TensorProto] = []
    replaced: set[str] = set()
    nodes: list[NodeProto] = []
    counts: Counter[str] = Counter()

    def const(base: str, value: np.ndarray) -> str:
        name = names(base)
        new_inits.append(numpy_helper.from_array(value, name))
        return name

    for index, original in enumerate(graph.node):
        node = NodeProto()
        node.CopyFrom(original)
        slots = plan.nodes.get(index, {})
        for slot, tensor in sorted(slots.items()):
            if isinstance(tensor, str):
                if tensor not in dequantized:
                    scale = const(f"{tensor}_scale", _scale_of(amax[tensor]))
                    zp = const(f"{tensor}_zero_point", zero)
                    q, dq = names(f"{tensor}_quantized"), names(f"{tensor}_dequantized")
                    nodes.append(helper.make_node("QuantizeLinear", [tensor, scale, zp], [q],
                                                  name=names(f"{tensor}_QuantizeLinear")))
                    nodes.append(helper.make_node("DequantizeLinear", [q, scale, zp], [dq],
                                                  name=names(f"{tensor}_DequantizeLinear")))
                    dequantized[tensor] = dq
                node.input[slot] = dequantized[tensor]
            else:
                weight = tensor
                key = (weight.name, weight.axis)
                if key not in weights:
                    q, scale = _quantize_weight(numpy_helper.to_array(inits[weight.name]), weight.axis)
                    zeros = zero if weight.axis is None else np.zeros(scale.shape, np.int8)
                    inputs = [const(f"{weight.name}_quantized", q), const(f"{weight.name}_scale", scale),
                              const(f"{weight.name}_zero_point", zeros)]
                    dq = names(f"{weight.name}_dequantized")
                    axis = {} if weight.axis is None else {"axis": weight.axis}
                    nodes.append(helper.make_node("DequantizeLinear", inputs, [dq],
                                                  name=names(f"{weight.name}_DequantizeLinear"), **axis))
                    weights[key] = dq
                    replaced.add(weight.name)
                node.input[slot] = weights[key]
        if slots:
            counts[node.op_type] += 1
        nodes.append(node)

    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(new_inits)
    # A float weight stays only where something else still reads it (a shared or tied weight).
    still = {name for n in _all_nodes(graph) for name in n.input} | {o.name for o in graph.output}
    drop = replaced - still
    if drop:
        for field_ in (graph.initializer, graph.input):  # an initializer listed as input goes with it
            kept = [v for v in field_ if v.name not in drop]
            del field_[:]
            field_.extend(kept)
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- output checks


def _check_for_tensorrt(model: ModelProto) -> None:
    """Guarantee what TensorRT requires of the Q/DQ graph, naming the node that breaks a rule."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[tuple[NodeProto, int]]] = {}
    for node in _all_nodes(graph):
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))
    for node in graph.node:
        if node.op_type not in _QDQ_OPS:
            continue
        zp = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zp is None or zp.data_type != TensorProto.INT8 or np.any(numpy_helper.to_array(zp)):
            raise BuildFailed(f"quantizer produced {node.op_type} {node.name!r} without a zero int8 zero point")
        if node.op_type == "DequantizeLinear":
            # A dequantized constant is a weight: only a weighted op takes it (into Add or Mul, TensorRT
            # refuses it as "Quantized constant ... is only allowed before DQ"). Activations may also feed Add.
            allowed = frozenset(_WEIGHTED_OPS) if node.input[0] in inits else _QUANTIZED_OPS
            for user, _ in consumers.get(node.output[0], []):
                if user.op_type not in allowed:
                    raise BuildFailed(f"quantizer placed DequantizeLinear {node.name!r} before {user.op_type} "
                                      f"{user.name!r}; only {', '.join(sorted(allowed))} take it for TensorRT")
    for tensor in graph.initializer:
        users = consumers.get(tensor.name, [])
        if tensor.data_type != TensorProto.INT8 or not any(u.op_type == "DequantizeLinear" for u, _ in users):
            continue  # not a quantized constant (an int8 table of the model's own is none of ours)
        for user, slot in users:
            if user.op_type in _QDQ_OPS and slot in (1, 2):
                continue  # a zero point
            if user.op_type != "DequantizeLinear" or slot != 0:
                raise BuildFailed(f"quantized constant {tensor.name!r} feeds {user.op_type} {user.name!r}; "
                                  f"TensorRT takes a quantized constant only into DequantizeLinear")


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


def _nothing_to_quantize(model: ModelProto, plan: _Plan) -> BuildFailed:
    """Say why no node can take int8: no weighted node, only ones inside control flow, or each one's reason."""
    weighted = "Conv, ConvTranspose, MatMul or Gemm"
    instead = "build fp16 for this model instead"
    if plan.skipped:
        ops = {_label(n, i): n.op_type for i, n in enumerate(model.graph.node)}
        listed = "; ".join(f"node {name!r} ({ops.get(name, '?')}): {why}"
                           for name, why in list(plan.skipped.items())[:5])
        more = f" (and {len(plan.skipped) - 5} more)" if len(plan.skipped) > 5 else ""
        return BuildFailed(f"cannot quantize: none of the model's {len(plan.skipped)} {weighted} nodes can take "
                           f"int8 Q/DQ: {listed}{more}; {instead}")
    nested = _nested_weighted(model)
    if nested:
        where = ", ".join(f"node {name!r} ({op}) holds {count}" for name, op, count in nested[:5])
        return BuildFailed(f"cannot quantize: the model's {weighted} nodes all sit inside control flow, where "
                           f"calibration cannot observe their inputs: {where}; give the input that decides the "
                           f"branch (such as a sample rate) as a fixed input so the If folds away, or {instead}")
    return BuildFailed(f"cannot quantize: the model has no {weighted} node, the operations TensorRT runs in int8; "
                       f"{instead}")


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
        current, converted_from = _raise_opset(model_path, work, large, reader)
        source, pre_error = _preprocess(current, work, large)
        if source is None:
            source = current if current != model_path else _stage_raw(model_path, work, large)
        try:
            qmodel = onnx.load(str(source))
        except Exception as exc:  # noqa: BLE001
            raise BuildFailed(f"cannot quantize: the model's weights do not load ({exc})") from None
        _constants_to_initializers(qmodel)
        plan = _plan(qmodel, per_channel)
        amax: dict[str, float] = {}
        if plan.nodes:
            try:
                amax = _calibrate(source, plan.activations(), reader, calibrate, work, large)
            except (SpecInvalid, BuildFailed):
                raise
            except Exception as exc:  # noqa: BLE001 - ORT raises many types; all mean this model cannot be done
                raise BuildFailed(f"int8 calibration failed: {type(exc).__name__}: {exc}") from None
            _prune(qmodel, plan, amax)
        if not plan.nodes:
            raise _nothing_to_quantize(qmodel, plan)
        op_types = _insert_qdq(qmodel, plan, amax)
        _check_for_tensorrt(qmodel)
        qdq = sum(1 for n in qmodel.graph.node if n.op_type in _QDQ_OPS)
        opset = _opset(qmodel)
        try:
            _save(qmodel, out_path, _tensor_bytes(qmodel) >= _INLINE_LIMIT)
        except BaseException:
            _remove_output(out_path)
            raise
        del qmodel
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _verify(out_path)

    granularity = "per-channel" if per_channel else "per-tensor"
    skipped = dict(list(plan.skipped.items())[:_REPORT_SKIPPED])
    return QuantizeReport(
        method=f"TensorRT Q/DQ placement, {calibrate.name}, {granularity}, symmetric int8",
        calibration_samples=count,
        quantized_nodes=qdq,
        op_types=op_types,
        preprocessed=pre_error is None,
        onnxruntime_version=ort.__version__,
        preprocess_error=pre_error,
        opset=opset,
        opset_converted_from=converted_from,
        skipped=skipped,
    )
