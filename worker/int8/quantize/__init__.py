"""Int8 Q/DQ quantization of a float ONNX model from calibration samples, by ONNX Runtime's quantization tool.

A float upload asked to build int8 is first quantized here and stored as a derived model. What the model
should look like depends on who runs it, so there is one recipe per target family (``RECIPES``):

- ``onnxruntime``: candidates (``CPU_CANDIDATES``), since the int8 form ONNX Runtime's CPU kernels run fastest
  depends on the network and the CPU: operator-format integer kernels (QLinearConv, QLinearMatMul, ...) on every
  layer; the same on convolutions alone; dynamic quantization of the matrix products (MatMulInteger, activations
  quantized at run time, ONNX Runtime's recipe for transformers). Weights are per-channel int8 in 7 bits
  (``reduce_range`` keeps AVX2's u8*s8 products from saturating), activations uint8. ``cpu_candidates`` says which
  differ on a model; worker/int8/choice.py measures them on the worker and keeps the fastest that passes the gate.
- ``tensorrt`` (TensorRT and TensorRT-RTX): explicit QuantizeLinear/DequantizeLinear as TensorRT documents
  it: symmetric int8 activations and weights (zero points 0), per-channel weights stored int8 behind a
  DequantizeLinear, float bias, Q/DQ only on the inputs of the operations TensorRT runs in int8 (Conv,
  ConvTranspose, Gemm, MatMul with a constant weight; attention MatMuls stay float), removable activations
  kept so TensorRT sees the graph it fuses.

Before the tool runs, a model older than opset 13 is raised to 13 (per-channel DequantizeLinear takes an
axis from there on) and ONNX Runtime's pre-processing (shape inference, constant folding) is applied.
Calibration uses the tool's calibrators (MinMax, entropy, percentile) on the user's samples.

The package: ``samples`` checks and feeds the calibration samples, ``opset`` raises old models to opset 13,
``preprocess`` runs ONNX Runtime's pre-processing, ``recipes`` holds each family's options and runs the tool,
``qdq`` checks a TensorRT model against TensorRT's rules, ``files`` loads the upload and verifies the output.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from enginefarm.core.errors import BuildFailed, SpecInvalid
from enginefarm.core.spec import BuildSpec
from enginefarm.graph.graphfacts import QDQ_OPS
from worker.int8.quantize.files import load_graph, remove_model_files, stored_bytes, verify
from worker.int8.quantize.opset import raise_opset
from worker.int8.quantize.preprocess import preprocessed_model, stage_raw
from worker.int8.quantize.qdq import check_for_tensorrt, float_for_other_readers
from worker.int8.quantize.recipes import (
    CPU_CANDIDATES,
    FAMILIES,
    METHODS,
    Recipe,
    check_options,
    cpu_candidates,
    quantize_with,
    recipe_of,
)
from worker.int8.quantize.samples import model_inputs, validate
from worker.rewrite.onnxgraph import INLINE_LIMIT, all_nodes, check_kept_layers, default_opset, save_model

__all__ = ["CPU_CANDIDATES", "FAMILIES", "METHODS", "QuantizeReport", "cpu_candidates", "quantize_qdq"]

log = logging.getLogger(__name__)

# Integer kernels of ONNX Runtime's operator format, and the ops that dequantized tensors feed in a Q/DQ model.
_INTEGER_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearSoftmax",
        "QAttention",
        "DynamicQuantizeMatMul",
    }
)


@dataclass
class QuantizeReport:
    """What the quantizer did, stored with the derived model so its provenance is visible."""

    method: str
    family: str  # the target family the model is for: onnxruntime or tensorrt
    calibration_samples: int
    quantized_nodes: int  # QuantizeLinear + DequantizeLinear nodes in the output
    op_types: dict[str, int]  # op type -> count of nodes that compute in int8 (or on dequantized inputs)
    preprocessed: bool
    onnxruntime_version: str
    options: dict[str, Any]  # the tool's options, as passed
    preprocess_error: str | None = None  # why pre-processing was skipped, when it failed
    opset: int = 0  # the output's default-domain opset
    opset_converted_from: int | None = None  # the upload's opset, when it had to be raised
    vs_fp32: dict[str, Any] | None = None  # the quantize stage's int8-against-fp32 timing (onnxruntime family)
    candidates: list[dict[str, Any]] | None = None  # every CPU candidate measured, and why this one was kept

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantize_qdq(
    model_path: Path,
    samples: dict[str, np.ndarray],
    out_path: Path,
    *,
    method: str = "minmax",
    calibration_batch: int = 1,
    family: str = "tensorrt",
    scratch: Path | None = None,
    recipe: str | Recipe | None = None,
    keep_fp32_layers: Sequence[str] = (),
    keep_fp32_ops: Sequence[str] = (),
) -> QuantizeReport:
    """Write an int8 version of ``model_path`` for ``family``, calibrated on ``samples``, to ``out_path``.

    ``samples`` maps each model input to an array stacking samples along axis 0; inputs whose first
    dim is fixed to something other than 1 take one whole array. ``recipe`` names one of ONNX Runtime's CPU
    candidates (``CPU_CANDIDATES``); None is the family's default. ``keep_fp32_layers`` (node names) and
    ``keep_fp32_ops`` (op types) stay in float, as the spec's fields of those names ask. Bad samples or options raise
    ``SpecInvalid``; a model that does not load or quantize raises ``BuildFailed``.
    """
    model_path, out_path = Path(model_path), Path(out_path)
    calibrate = check_options(method, calibration_batch, family)
    chosen = recipe_of(family, recipe)
    model = load_graph(model_path)
    check_kept_layers(model.graph, keep_fp32_layers)
    reader, count = validate(model_inputs(model), samples, calibration_batch)
    large = stored_bytes(model_path, model) >= INLINE_LIMIT
    del model

    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="quantize-", dir=scratch))
    try:
        current, converted_from = raise_opset(model_path, work, large, reader)
        source, pre_error = preprocessed_model(current, work, large)
        if source is None:
            source = current if current != model_path else stage_raw(model_path, work, large)
        remove_model_files(out_path)  # no stale data file stays beside an output that needs none
        try:
            keep = _kept_nodes(source, keep_fp32_layers, keep_fp32_ops)
            options = quantize_with(chosen, source, out_path, reader, calibrate, large, keep)
            if keep:
                options["kept_float"] = keep
        except (SpecInvalid, BuildFailed):
            remove_model_files(out_path)
            raise
        except Exception as exc:
            remove_model_files(out_path)
            log.warning("int8 quantization (%s) of %s failed", chosen.name, model_path, exc_info=True)
            raise BuildFailed(f"int8 quantization failed: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if family == "tensorrt":
        try:
            full = onnx.load(str(out_path))
            if float_for_other_readers(full):
                remove_model_files(out_path)
                save_model(full, out_path, external=large)
            check_for_tensorrt(full)
            del full
        except BuildFailed:
            remove_model_files(out_path)
            raise
    qmodel = onnx.load(str(out_path), load_external_data=False)
    op_types = _int8_ops(qmodel)
    if not op_types:
        remove_model_files(out_path)
        raise BuildFailed(
            "cannot quantize: ONNX Runtime's quantizer found no operation to run in int8 (no Conv, "
            "ConvTranspose, MatMul or Gemm with a constant weight outside control flow, or every "
            "such input was all zeros on the samples); build fp16 for this model instead"
        )
    qdq = sum(1 for n in all_nodes(qmodel.graph) if n.op_type in QDQ_OPS)
    opset = default_opset(qmodel, missing=0)
    del qmodel
    verify(out_path)
    tool = "quantize_dynamic" if chosen.dynamic else "quantize_static"
    return QuantizeReport(
        method=f"onnxruntime.quantization.{tool}, {chosen.label}" + ("" if chosen.dynamic else f", {calibrate.name}"),
        family=family,
        calibration_samples=count,
        quantized_nodes=qdq,
        op_types=op_types,
        preprocessed=pre_error is None,
        onnxruntime_version=ort.__version__,
        options=options,
        preprocess_error=pre_error,
        opset=opset,
        opset_converted_from=converted_from,
    )


def quantize_for_spec(
    model_path: Path,
    samples: dict[str, np.ndarray],
    out_path: Path,
    spec: BuildSpec,
    family: str,
    scratch: Path,
    recipe: str | Recipe | None = None,
    keep_fp32_layers: Sequence[str] | None = None,
) -> QuantizeReport:
    """``quantize_qdq`` with the spec's calibration and what it keeps in float (``keep_fp32_layers``: other layers)."""
    return quantize_qdq(
        model_path,
        samples,
        out_path,
        method=spec.calibration.method.value,
        calibration_batch=spec.calibration.batch,
        family=family,
        scratch=scratch,
        recipe=recipe,
        keep_fp32_layers=spec.keep_fp32_layers if keep_fp32_layers is None else keep_fp32_layers,
        keep_fp32_ops=spec.keep_fp32_ops,
    )


def _kept_nodes(source: Path, layers: Sequence[str], ops: Sequence[str]) -> list[str]:
    """The names of the nodes left in float: those named, and those of the kept op types in the model quantized."""
    if not layers and not ops:
        return []
    model = onnx.load(str(source), load_external_data=False)
    by_type = [n.name for n in model.graph.node if n.op_type in set(ops) and n.name]
    return sorted(set(layers) | set(by_type))


def _int8_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> how many nodes compute in int8: integer kernels, and the consumers of DequantizeLinear outputs."""
    counts: Counter[str] = Counter()
    dequantized = {o for n in all_nodes(model.graph) if n.op_type == "DequantizeLinear" for o in n.output}
    for node in all_nodes(model.graph):
        if node.op_type in _INTEGER_OPS or (node.op_type not in QDQ_OPS and dequantized.intersection(node.input)):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))
