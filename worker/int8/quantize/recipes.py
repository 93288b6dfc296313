"""The recipes: the options ONNX Runtime's quantization tool gets, and the call itself.

TensorRT targets get one recipe, ONNX Runtime's CPU targets candidates (``CPU_CANDIDATES``; which, and why: the
package's docstring); worker/int8/choice.py measures those that apply to a model and keeps the fastest that passes."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.registry import QLinearOpsRegistry

from enginefarm.core.domain import QUANTIZE_FAMILIES
from enginefarm.core.errors import SpecInvalid
from worker.int8.quantize.qdq import WEIGHTED_OPS
from worker.int8.quantize.samples import SampleReader, problem
from worker.rewrite.onnxgraph import constant_tensors, save_model

log = logging.getLogger(__name__)

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
FAMILIES = QUANTIZE_FAMILIES
# Calibrators keep every batch's intermediate tensors until they merge them: merge every this many.
_CHUNK_BATCHES = 32
_TENSORRT_OPS = list(WEIGHTED_OPS)


@dataclass(frozen=True)
class Recipe:
    """How one target family wants its int8 model."""

    label: str
    quant_format: QuantFormat
    activation_type: QuantType
    weight_type: QuantType
    reduce_range: bool | None  # None: only on CPUs without VNNI (ONNX Runtime's advice for u8*s8 products)
    op_types: list[str] | None = None  # None: every op type the tool can quantize
    weighted_only: bool = False  # leave MatMuls of two computed tensors (attention) in float
    extra: dict[str, Any] = field(default_factory=dict)
    dynamic: bool = False  # quantize_dynamic: int8 weights, activations quantized at run time (no calibration)
    dense_only: bool = False  # leave grouped (depthwise) convolutions in float
    name: str = ""  # the candidate's name where a family has several

    per_channel: bool = True

    def reduced(self) -> bool:
        """Whether weights are stored in 7 bits on this worker."""
        if self.reduce_range is not None:
            return self.reduce_range
        from enginefarm.measure.ort_runner import cpu_has_vnni

        return not cpu_has_vnni()

    def options(self) -> dict[str, Any]:
        """The options as the report records them."""
        return {
            "tool": "quantize_dynamic" if self.dynamic else "quantize_static",
            "recipe": self.name,
            "quant_format": self.quant_format.name,
            "activation_type": self.activation_type.name,
            "weight_type": self.weight_type.name,
            "per_channel": self.per_channel,
            "reduce_range": self.reduced(),
            "op_types_to_quantize": self.op_types,
            "extra_options": dict(self.extra),
        }


# The products whose weights are constants: what dynamic quantization turns into integer kernels
# (MatMulInteger / DynamicQuantizeMatMul, DynamicQuantizeLSTM, QAttention).
_MATRIX_OPS = ["MatMul", "Gemm"]
_DYNAMIC_OPS = ["MatMul", "LSTM", "Attention"]
_CONV_OPS = ["Conv", "ConvTranspose"]
# What the operator format quantizes besides convolutions (and the activations it folds into them).
_OPERATOR_OTHERS = frozenset(QLinearOpsRegistry) - {"Conv", "Relu", "Clip"}


def _cpu(name: str, label: str, **options: Any) -> Recipe:
    """A CPU candidate: the operator format, uint8 activations, per-channel int8 weights in 7 bits without VNNI."""
    return Recipe(
        label, QuantFormat.QOperator, QuantType.QUInt8, QuantType.QInt8, reduce_range=None, name=name, **options
    )


# ONNX Runtime's CPU candidates, in order of preference when they measure alike. Each was measured on the
# real-model corpus (docs/models.md; bench/models.py --int8-only --candidates reproduces it). The operator format
# won over QDQ (u8s8, s8s8, u8u8) where every layer is quantized; 7-bit weights (reduce_range) keep the u8*s8
# products of CPUs without VNNI from saturating.
CPU_CANDIDATES: dict[str, Recipe] = {
    "operator": _cpu(
        "operator",
        "operator format (QLinear kernels) on every layer, per-channel int8 weights in 7 bits, uint8 activations",
    ),
    "convolutions": _cpu(
        "convolutions",
        "operator format on convolutions only (matrix products stay float), per-channel int8 "
        "weights in 7 bits, uint8 activations",
        op_types=_CONV_OPS,
    ),
    "dense-convolutions": _cpu(
        "dense-convolutions",
        "operator format on dense convolutions only (depthwise and other grouped "
        "convolutions and the matrix products stay float), per-channel int8 weights in 7 "
        "bits, uint8 activations",
        op_types=_CONV_OPS,
        dense_only=True,
    ),
    "dynamic": _cpu(
        "dynamic",
        "dynamic: per-channel int8 weights of the matrix products with a constant weight (MatMul, "
        "LSTM, Attention), in 7 bits on CPUs without VNNI, activations quantized at run time, "
        "convolutions float",
        op_types=_DYNAMIC_OPS,
        dynamic=True,
        extra={"MatMulConstBOnly": True},
    ),
}

RECIPES: dict[str, Recipe] = {
    "onnxruntime": CPU_CANDIDATES["operator"],
    "tensorrt": Recipe(
        "TensorRT Q/DQ, per-channel, symmetric int8 activations and weights",
        QuantFormat.QDQ,
        QuantType.QInt8,
        QuantType.QInt8,
        reduce_range=False,
        op_types=_TENSORRT_OPS,
        weighted_only=True,
        extra={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "QuantizeBias": False,
            "QDQKeepRemovableActivations": True,
            "OpTypesToExcludeOutputQuantization": _TENSORRT_OPS,
            "AddQDQPairToWeight": False,
            "DedicatedQDQPair": False,
        },
        name="tensorrt",
    ),
}


def cpu_candidates(source: Path) -> list[str]:
    """The CPU candidates that differ on this model: the operator format everywhere; convolutions alone where the
    operator format would also quantize other operations (matrix products, Add, pooling, ...); dense convolutions
    alone where some are grouped (depthwise: ONNX Runtime's int8 kernels for them lose to its float ones);
    dynamic where there are matrix products with a constant weight beyond a classifier's last one, or an LSTM."""
    model = onnx.load(str(source), load_external_data=False)
    constants = set(constant_tensors(model.graph))
    ops = {n.op_type for n in model.graph.node}
    convs = sum(1 for n in model.graph.node if n.op_type in _CONV_OPS)
    matrices = sum(1 for n in model.graph.node if n.op_type in _MATRIX_OPS and constants.intersection(n.input[1:2]))
    grouped = sum(1 for n in model.graph.node if n.op_type in _CONV_OPS and _group(n) > 1)
    names = ["operator"]
    if convs and ops & _OPERATOR_OTHERS:
        names.append("convolutions")
    if grouped and convs > grouped:
        names.append("dense-convolutions")
    if matrices > 1 or (matrices and not convs) or "LSTM" in ops:
        names.append("dynamic")
    return names


def recipe_of(family: str, candidate: str | Recipe | None) -> Recipe:
    """The family's recipe, or for ONNX Runtime's CPU family one of its candidates by name (or a recipe given)."""
    if candidate is None:
        return RECIPES[family]
    if isinstance(candidate, Recipe):
        return candidate
    if family != "onnxruntime" or candidate not in CPU_CANDIDATES:
        raise ValueError(f"no int8 recipe {candidate!r} for the {family} family")
    return CPU_CANDIDATES[candidate]


def check_options(method: str, calibration_batch: int, family: str = "tensorrt") -> CalibrationMethod:
    """Return the calibration method ``method`` names; raise SpecInvalid naming every bad option."""
    problems = []
    calibrate = METHODS.get(method.lower()) if isinstance(method, str) else None
    if calibrate is None:
        msg = f"unknown calibration method {method!r}; use one of {', '.join(METHODS)}"
        problems.append(problem(["method"], msg))
    if isinstance(calibration_batch, bool) or not isinstance(calibration_batch, int) or calibration_batch < 1:
        msg = f"calibration_batch must be an integer >= 1, not {calibration_batch!r}"
        problems.append(problem(["calibration_batch"], msg))
    if family not in RECIPES:
        problems.append(problem(["family"], f"unknown target family {family!r}; use one of {', '.join(RECIPES)}"))
    if problems or calibrate is None:  # an unknown method is one of the problems
        raise SpecInvalid("; ".join(p["msg"] for p in problems), problems=problems)
    return calibrate


def quantize_with(
    recipe: Recipe,
    source: Path,
    out: Path,
    reader: SampleReader,
    calibrate: CalibrationMethod,
    large: bool,
    keep_float: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the recipe's tool with its options on ``source``; ``keep_float``: node names left in float. Returns
    the options as recorded."""
    if recipe.dynamic:
        quantize_dynamic(
            str(source),
            str(out),
            op_types_to_quantize=recipe.op_types,
            per_channel=recipe.per_channel,
            reduce_range=recipe.reduced(),
            weight_type=recipe.weight_type,
            nodes_to_exclude=list(keep_float),
            use_external_data_format=large,
            extra_options=dict(recipe.extra),
        )
        return recipe.options()
    # Calibrators hold every batch's intermediate tensors until they compute ranges: feed them in strides of at
    # most _CHUNK_BATCHES batches (ORT's CalibMaxIntermediateOutputs drops the data it holds instead of merging it).
    batches = len(reader)
    extra = {
        **recipe.extra,
        "CalibStridedMinMax": max(d for d in range(1, min(_CHUNK_BATCHES, batches) + 1) if batches % d == 0),
    }
    if recipe.activation_type == QuantType.QInt8 and recipe.extra.get("ActivationSymmetric"):
        extra["CalibTensorRangeSymmetric"] = True
    if recipe.weighted_only:
        source = _untied(source, large)
    exclude = [*keep_float, *(_activation_matmuls(source) if recipe.weighted_only else [])]
    if recipe.dense_only:
        exclude += _grouped_convs(source)
    reader.rewind()
    chatter = io.StringIO()  # the histogram calibrators print their progress
    with contextlib.redirect_stdout(chatter):
        quantize_static(
            str(source),
            str(out),
            reader,
            quant_format=recipe.quant_format,
            op_types_to_quantize=recipe.op_types,
            per_channel=recipe.per_channel,
            reduce_range=recipe.reduced(),
            activation_type=recipe.activation_type,
            weight_type=recipe.weight_type,
            calibrate_method=calibrate,
            use_external_data_format=large,
            extra_options=extra,
            nodes_to_exclude=exclude,
        )
    log.debug("calibration: %s", chatter.getvalue().strip())
    reader.rewind()
    return {**recipe.options(), "calibrate_method": calibrate.name}


def _activation_matmuls(source: Path) -> list[str]:
    """Names of the MatMul nodes with no constant input: per-tensor ranges of attention probabilities cost
    accuracy for a speed-up that depends on TensorRT's int8 attention kernels."""
    model = onnx.load(str(source), load_external_data=False)
    constants = set(constant_tensors(model.graph))
    return [
        n.name for n in model.graph.node if n.op_type == "MatMul" and n.name and not constants.intersection(n.input)
    ]


def _grouped_convs(source: Path) -> list[str]:
    """Names of the convolutions with more than one group (depthwise ones among them)."""
    model = onnx.load(str(source), load_external_data=False)
    return [n.name for n in model.graph.node if n.op_type in _CONV_OPS and _group(n) > 1 and n.name]


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _untied(source: Path, large: bool) -> Path:
    """The model with a float copy of each weight that a weighted op shares with another op (a tied embedding
    read by Gather): the quantizer swaps a weight for its DequantizeLinear everywhere, and TensorRT takes a
    dequantized constant only into a weighted op. Written beside ``source`` (the work folder) when needed."""
    model = onnx.load(str(source), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    weighted = {i for n in model.graph.node if n.op_type in _TENSORRT_OPS for i in n.input if i in weights}
    if not any(i in weighted for n in model.graph.node if n.op_type not in _TENSORRT_OPS for i in n.input):
        return source
    model = onnx.load(str(source))
    others = [
        (n, k)
        for n in model.graph.node
        if n.op_type not in _TENSORRT_OPS
        for k, i in enumerate(n.input)
        if i in weighted
    ]
    inits = {t.name: t for t in model.graph.initializer}
    copies: dict[str, str] = {}
    for node, slot in others:
        name = node.input[slot]
        if name not in copies:
            copies[name] = f"{name}_float"
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = copies[name]
            model.graph.initializer.append(copy)
        node.input[slot] = copies[name]
    out = source.with_name("untied.onnx")
    save_model(model, out, external=large)
    return out
