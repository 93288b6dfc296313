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

The package: ``samples`` checks and feeds the calibration samples, ``opset`` raises old models to opset 13,
``preprocess`` runs ONNX Runtime's pre-processing, ``placement`` plans where Q/DQ goes, ``calibrate``
collects the ranges, ``qdq`` writes the Q/DQ nodes and checks them against TensorRT's rules, ``files``
loads the upload and verifies the output.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from enginefarm.errors import BuildFailed, SpecInvalid
from enginefarm.graph.graphfacts import QDQ_OPS
from enginefarm.worker.onnxgraph import INLINE_LIMIT, default_opset, save_model
from enginefarm.worker.quantize.calibrate import METHODS, calibrated_amax, check_options
from enginefarm.worker.quantize.files import load_graph, remove_model_files, stored_bytes, tensor_bytes, verify
from enginefarm.worker.quantize.opset import raise_opset
from enginefarm.worker.quantize.placement import constants_to_initializers, nothing_to_quantize, plan_qdq, prune
from enginefarm.worker.quantize.preprocess import preprocessed_model, stage_raw
from enginefarm.worker.quantize.qdq import check_for_tensorrt, insert_qdq
from enginefarm.worker.quantize.samples import model_inputs, validate

__all__ = ["METHODS", "QuantizeReport", "quantize_qdq"]

# A protobuf message cannot exceed 2 GiB; leave room for the graph itself beside the weights.
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
    calibrate = check_options(method, calibration_batch)
    model = load_graph(model_path)
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
        try:
            qmodel = onnx.load(str(source))
        except Exception as exc:  # noqa: BLE001
            raise BuildFailed(f"cannot quantize: the model's weights do not load ({exc})") from None
        constants_to_initializers(qmodel)
        plan = plan_qdq(qmodel, per_channel)
        amax: dict[str, float] = {}
        if plan.nodes:
            try:
                amax = calibrated_amax(source, plan.activations(), reader, calibrate, work, large)
            except (SpecInvalid, BuildFailed):
                raise
            except Exception as exc:  # noqa: BLE001 - ORT raises many types; all mean this model cannot be done
                raise BuildFailed(f"int8 calibration failed: {type(exc).__name__}: {exc}") from None
            prune(qmodel, plan, amax)
        if not plan.nodes:
            raise nothing_to_quantize(qmodel, plan)
        op_types = insert_qdq(qmodel, plan, amax)
        check_for_tensorrt(qmodel)
        qdq = sum(1 for n in qmodel.graph.node if n.op_type in QDQ_OPS)
        opset = default_opset(qmodel, missing=0)
        try:
            remove_model_files(out_path)  # no stale data file stays beside an output that needs none
            save_model(qmodel, out_path, external=tensor_bytes(qmodel) >= INLINE_LIMIT)
        except BaseException:
            remove_model_files(out_path)
            raise
        del qmodel
    finally:
        shutil.rmtree(work, ignore_errors=True)
    verify(out_path)

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
