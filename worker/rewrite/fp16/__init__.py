"""Mixed fp16/fp32 ONNX models for strongly typed TensorRT builds.

A strongly typed builder (TensorRT-RTX always, full TensorRT with the STRONGLY_TYPED flag) takes
every layer's precision from the tensor types of the graph, so an fp16 engine needs a graph whose
tensors are float16. Converting every float32 tensor breaks real models: shape arithmetic done in
float (YOLOv8's anchor grid: Shape -> Cast(float) -> Range) ends up mixing float and half, which
TensorRT-RTX rejects ("Input 0's element type (float) differs from input 1's element type (half)"),
and some values do not fit in fp16 at all (a BatchNormalization variance of 9.8e7 in PP-OCRv4's
detector, clamped to 65504, silences the whole output).

This module decides which nodes stay in float32 and lets ONNX Runtime's float16 converter
(``onnxruntime.transformers.float16``, shipped inside the onnxruntime wheel) rewrite each graph
with that block list. What stays float32, in order of precedence:

- nodes and op types the user names;
- the boundary of control flow (If/Loop/Scan): the node's outputs and the outer tensors its
  subgraphs read are float32. Each body is converted by the same rules as a graph of its own, with
  float32 inputs and outputs (or kept float32 whole, with ``convert_subgraphs=False`` or when its
  conversion fails). Keeping bodies float32 costs more than speed: TensorRT-RTX has no float32
  GEMM on Turing (sm75), so a MatMul left in float32 fails the sm75 build;
- ops of other domains (custom ops, plugins): their kernels' types are unknown here;
- ops whose ONNX schema, at the model's opset, has no float16 (Range, CumSum before opset 14,
  Equal before 11, Upsample's float-only scales...);
- shape and index arithmetic: nodes whose outputs flow only into shape or index inputs
  (Reshape/Expand/Tile/ConstantOfShape shapes, Slice starts/ends/axes/steps, Resize roi/scales/sizes,
  TopK k, Gather/Scatter indices, Range, Pad pads, axes inputs...), Range and NonZero themselves,
  and nodes computed only from Shape/Size outputs and constants (anchor grids, position
  embeddings). Shape and Size read only dimensions and read fp16 tensors as they are;
- nodes that read a constant with a finite value beyond fp16's range (|x| > 65504), which the
  conversion would otherwise clamp (NVIDIA Model Optimizer's AutoCast keeps these in fp32 by default,
  its ``init_max``). Values of 1e30 and more are mask fills (finfo(float32).min), saturated to
  -65504 instead;
- precision-sensitive ops (``PRECISION_SENSITIVE_OPS``): reductions that sum (global average
  pooling included), Exp/Log/Pow, CumSum and the normalizations; the element-wise ops that only
  carry their results on (the ``Add(var, eps) -> Sqrt`` of a decomposed LayerNorm); and data
  movement (Reshape, Transpose, Concat...) whose inputs all come from float32 nodes.

Initializers and Constant nodes become fp16 only where their readers are fp16; one read by both
kinds is split into an fp16 and an fp32 copy. Casts at the boundaries come from the converter; the
float32 -> fp16 -> float32 round trips it leaves between two float32 nodes are removed again, so
values passing between float32 nodes are exact. The result is checked with ``onnx.checker`` and
strict shape/type inference before it is returned.

Weights stored as external data (models over 2 GB) are streamed in chunks into a new data file
beside the output, converted or copied as they are: memory holds a chunk, not the weights.

The package: ``keep_fp32`` decides what stays float32 and why, ``prepare`` rewrites a graph for the
converter, ``convert`` runs it and cleans up after it, ``subgraphs`` handles control-flow bodies,
``weights`` reads, converts and streams initializer data, ``report`` counts what was done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

from worker.rewrite.fp16.convert import Options, check, convert_graph
from worker.rewrite.fp16.keep_fp32 import PRECISION_SENSITIVE_OPS
from worker.rewrite.fp16.prepare import prepare
from worker.rewrite.fp16.report import Fp16Report, Tally
from worker.rewrite.fp16.subgraphs import convert_bodies, move_weights_into_bodies
from worker.rewrite.fp16.weights import TensorReader, free_file_name, write_initializers
from worker.rewrite.onnxgraph import INLINE_LIMIT, all_graphs, all_tensors, check_kept_layers, save_model, tensor_types

__all__ = ["Fp16Report", "fp16_model"]

log = logging.getLogger(__name__)


def fp16_model(
    model_path: Path,
    out_path: Path,
    *,
    keep_fp32_op_types: Iterable[str] = (),
    keep_fp32_nodes: Iterable[str] = (),
    keep_io_types: bool = True,
    precision_sensitive_ops: Iterable[str] = PRECISION_SENSITIVE_OPS,
    convert_subgraphs: bool = True,
) -> Fp16Report:
    """Write a type-correct mixed fp16/fp32 copy of ``model_path`` to ``out_path`` for a strongly typed build.

    ``keep_fp32_op_types`` and ``keep_fp32_nodes`` keep more in float32; a node name the model does not
    have is a SpecInvalid. With ``keep_io_types`` the float32 inputs and outputs stay float32, with
    casts inside. The bodies of If/Loop/Scan are converted by the same rules with float32 at their
    boundaries (``convert_subgraphs``), or kept float32 whole. ONNX Runtime's float16 converter
    rewrites each graph. Raises BuildFailed when the result is not a valid, type-correct model.
    """
    model_path, out_path = Path(model_path), Path(out_path)
    model = onnx.load(str(model_path), load_external_data=False)
    check_kept_layers(model.graph, keep_fp32_nodes)
    tally = Tally()
    prepare(model, tally.notes)
    model = onnx.shape_inference.infer_shapes(model)
    reader = TensorReader(model_path.resolve().parent)
    opts = Options(
        keep_ops=set(keep_fp32_op_types),
        keep_nodes=set(keep_fp32_nodes),
        sensitive_ops=set(precision_sensitive_ops),
        reader=reader,
        opset_import=list(model.opset_import),
        ir_version=model.ir_version,
    )
    if convert_subgraphs:
        move_weights_into_bodies(model.graph)
        all_types: dict[str, int] = {}
        for graph in all_graphs(model.graph):
            all_types.update(tensor_types(graph))
        convert_bodies(model.graph, all_types, opts, tally)

    sources = {reader.location(t)[0] for t in all_tensors(model) if uses_external_data(t)}
    data_name = free_file_name(out_path, sources) if sources else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = convert_graph(
        model,
        opts,
        tally,
        keep_io_types=keep_io_types,
        write=lambda m, names: write_initializers(m, names, reader, out_path.parent, data_name),
    )
    large = data_name is None and model.ByteSize() > INLINE_LIMIT
    if large:
        data_name = free_file_name(out_path, sources)
    save_model(model, out_path, external=large, location=data_name)
    check(out_path)

    report = tally.report(keep_io_types=keep_io_types, external_data=data_name)
    log.info("%s", report.summary())
    return report
