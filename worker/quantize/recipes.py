"""One recipe per target family: the options ONNX Runtime's ``quantize_static`` gets, and the call itself."""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

from enginefarm.errors import SpecInvalid
from enginefarm.worker.onnxgraph import save_model
from enginefarm.worker.quantize.samples import SampleReader, problem

log = logging.getLogger(__name__)

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
FAMILIES = ("onnxruntime", "tensorrt")
# Calibrators keep every batch's intermediate tensors until they merge them: merge every this many.
_CHUNK_BATCHES = 32
# The operations TensorRT runs in int8 when their inputs come through Q/DQ.
_TENSORRT_OPS = ["Conv", "ConvTranspose", "MatMul", "Gemm"]


@dataclass(frozen=True)
class Recipe:
    """How one target family wants its int8 model."""

    label: str
    quant_format: QuantFormat
    activation_type: QuantType
    weight_type: QuantType
    reduce_range: bool
    op_types: list[str] | None = None  # None: every op type the tool can quantize
    weighted_only: bool = False  # leave MatMuls of two computed tensors (attention) in float
    extra: dict[str, Any] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """The options as the report records them."""
        return {"quant_format": self.quant_format.name, "activation_type": self.activation_type.name,
                "weight_type": self.weight_type.name, "per_channel": True, "reduce_range": self.reduce_range,
                "op_types_to_quantize": self.op_types, "extra_options": dict(self.extra)}


RECIPES: dict[str, Recipe] = {
    # Measured on the real-model corpus against QDQ (u8s8, s8s8, u8u8) and the other operator-format variants:
    # docs/models.md has the figures and bench/models.py reproduces them.
    "onnxruntime": Recipe("operator format (QLinear kernels), per-channel int8 weights in 7 bits, uint8 activations",
                          QuantFormat.QOperator, QuantType.QUInt8, QuantType.QInt8, reduce_range=True),
    "tensorrt": Recipe("TensorRT Q/DQ, per-channel, symmetric int8 activations and weights",
                       QuantFormat.QDQ, QuantType.QInt8, QuantType.QInt8, reduce_range=False, op_types=_TENSORRT_OPS,
                       weighted_only=True,
                       extra={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False,
                              "QDQKeepRemovableActivations": True,
                              "OpTypesToExcludeOutputQuantization": _TENSORRT_OPS,
                              "AddQDQPairToWeight": False, "DedicatedQDQPair": False}),
}


def family_of(backend: str) -> str:
    """The recipe a build backend's engines are made from: ONNX Runtime's own, else TensorRT's."""
    return "onnxruntime" if backend == "onnxruntime" else "tensorrt"


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
    if problems:
        raise SpecInvalid("; ".join(p["msg"] for p in problems), problems=problems)
    return calibrate  # type: ignore[return-value]


def quantize_with(recipe: Recipe, source: Path, out: Path, reader: SampleReader, calibrate: CalibrationMethod,
                  large: bool) -> dict[str, Any]:
    """Run ``quantize_static`` with the recipe's options on ``source``; returns the options as recorded."""
    # Calibrators hold every batch's intermediate tensors until they compute ranges: feed them in strides of at
    # most _CHUNK_BATCHES batches (ORT's CalibMaxIntermediateOutputs drops the data it holds instead of merging it).
    batches = len(reader)
    extra = {**recipe.extra, "CalibStridedMinMax": max(d for d in range(1, min(_CHUNK_BATCHES, batches) + 1)
                                                       if batches % d == 0)}
    if recipe.activation_type == QuantType.QInt8 and recipe.extra.get("ActivationSymmetric"):
        extra["CalibTensorRangeSymmetric"] = True
    if recipe.weighted_only:
        source = _untied(source, large)
    exclude = _activation_matmuls(source) if recipe.weighted_only else []
    reader.rewind()
    chatter = io.StringIO()  # the histogram calibrators print their progress
    with contextlib.redirect_stdout(chatter):
        quantize_static(str(source), str(out), reader, quant_format=recipe.quant_format,
                        op_types_to_quantize=recipe.op_types, per_channel=True, reduce_range=recipe.reduce_range,
                        activation_type=recipe.activation_type, weight_type=recipe.weight_type,
                        calibrate_method=calibrate, use_external_data_format=large, extra_options=extra,
                        nodes_to_exclude=exclude)
    log.debug("calibration: %s", chatter.getvalue().strip())
    reader.rewind()
    return {**recipe.options(), "calibrate_method": calibrate.name}


def _activation_matmuls(source: Path) -> list[str]:
    """Names of the MatMul nodes with no constant input: per-tensor ranges of attention probabilities cost
    accuracy for a speed-up that depends on TensorRT's int8 attention kernels."""
    model = onnx.load(str(source), load_external_data=False)
    constants = {t.name for t in model.graph.initializer}
    constants |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node
            if n.op_type == "MatMul" and n.name and not constants.intersection(n.input)]


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
    others = [(n, k) for n in model.graph.node if n.op_type not in _TENSORRT_OPS
              for k, i in enumerate(n.input) if i in weighted]
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
