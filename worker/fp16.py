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
"""
from __future__ import annotations

import functools
import heapq
import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from enginefarm.errors import BuildFailed, SpecInvalid

log = logging.getLogger(__name__)

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = float(np.finfo(np.float16).max)  # 65504

# Kept in float32 unless the caller passes another set. Sums over many elements overflow fp16 (a
# ReduceSum of 768 squared activations of magnitude 10 is already 76800 > 65504) and lose the
# small terms; a global average pool is such a sum (PP-OCRv4's detector at 320x320: its SE blocks
# average 80x80 maps with activations up to 597, and an fp16 accumulator overflows); exp/pow
# overflow (exp(x) is inf in fp16 from x = 11.1); log of values that fp16 flushes to zero is -inf;
# normalizations compute a variance, a sum of squares. AutoCast's depth-of-reduction rule and
# TensorRT's own warning about fp16 LayerNorm ("may cause overflow ... forcing layernorm layers to
# run in FP32 precision can help") point the same way. Softmax is left in fp16: it subtracts the
# maximum first and its outputs lie in [0, 1] (fp16 arithmetic on real activations, attention masks
# of -3.4e38 included, stays within 1.2e-3 relative error). MatMul/Conv/Gemm stay fp16: TensorRT
# accumulates them in fp32 on tensor cores, and they are what fp16 is for.
PRECISION_SENSITIVE_OPS: frozenset[str] = frozenset({
    "ReduceSum", "ReduceMean", "ReduceProd", "ReduceSumSquare", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "GlobalAveragePool",
    "Exp", "Log", "Pow", "CumSum",
    "LayerNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization",
    "LpNormalization", "MeanVarianceNormalization",
})

# Inputs that carry shapes, indices, axes or counts rather than data: op type -> input positions.
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(idx) for op, idx in {
        "Reshape": {1}, "Expand": {1}, "Tile": {1}, "ConstantOfShape": {0},
        "Slice": {1, 2, 3, 4}, "Resize": {1, 2, 3}, "Upsample": {1},
        "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1}, "Pad": {1, 3},
        "TopK": {1}, "OneHot": {1}, "Trilu": {1}, "CumSum": {1}, "Compress": {1},
        "Gather": {1}, "GatherElements": {1}, "GatherND": {1},
        "Scatter": {1}, "ScatterElements": {1}, "ScatterND": {1},
        "Range": {0, 1, 2}, "NonMaxSuppression": {2, 3, 4}, "RoiAlign": {2},
        "MaxUnpool": {2}, "CenterCropPad": {1}, "Col2Im": {1, 2}, "DFT": {1, 2}, "STFT": {1, 2},
        "ReduceSum": {1}, "ReduceMean": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceProd": {1},
        "ReduceSumSquare": {1}, "ReduceL1": {1}, "ReduceL2": {1}, "ReduceLogSum": {1},
        "ReduceLogSumExp": {1},
    }.items()
}
# Index computations kept in fp32 themselves: their outputs are positions or counts.
INDEX_OPS: frozenset[str] = frozenset({"Range", "NonZero"})
# Read only the dimensions of their input; they never need a cast.
_SHAPE_READERS = frozenset({"Shape", "Size"})
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
# Ops that only move or select data: kept in float32 when all their float inputs come from float32
# nodes, so a float32 result is not rounded to fp16 on its way to the outputs or to other float32 nodes.
_MOVEMENT_OPS = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat",
                           "Slice", "Gather", "GatherElements", "GatherND", "Split", "Expand", "Tile",
                           "Pad", "DepthToSpace", "SpaceToDepth"})
# Element-wise ops that carry a precision-sensitive fp32 result on while their other inputs are constants.
_CHAIN_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Neg", "Abs", "Max", "Min",
                        "Clip", "Identity"})
_DEFAULT_DOMAINS = ("", "ai.onnx")
# A protobuf message cannot exceed 2 GiB; above this the output's weights go to an external file.
_INLINE_LIMIT = 1 << 30
_ALIGN = 64
# Elements per chunk when reading or converting weights (16 MiB of float32).
_CHUNK = 1 << 22
# Constants at least this large stand for "minus/plus infinity" (attention-mask fills), not for values.
_SENTINEL = 1e30

# Why a node stayed in float32, in order of precedence.
USER_NODE = "user-node"
USER_OP = "user-op-type"
CONTROL_FLOW = "control-flow"
CUSTOM_DOMAIN = "custom-domain"
NO_FP16 = "no-fp16-in-onnx-schema"
SHAPE = "shape-arithmetic"
SHAPE_DERIVED = "computed-from-shapes"
CONST_RANGE = "constant-beyond-fp16-range"
SENSITIVE = "precision-sensitive-op"
CHAIN = "follows-precision-sensitive-op"
MOVES_FP32 = "moves-fp32-data"
REASONS = (USER_NODE, USER_OP, CONTROL_FLOW, CUSTOM_DOMAIN, NO_FP16, SHAPE, SHAPE_DERIVED, CONST_RANGE,
           SENSITIVE, CHAIN, MOVES_FP32)


@dataclass
class Fp16Report:
    """What the conversion did. Node counts are over every graph of the source model, control-flow
    bodies included; ``kept_fp32`` and ``kept_fp32_nodes`` say which float nodes stayed float32 and why."""

    converter: str
    nodes: int
    fp16_nodes: int
    fp32_nodes: int
    # Constant nodes, Shape/Size, and nodes with no float32 input or output (integer shape
    # arithmetic, boolean logic); constants follow their readers.
    other_nodes: int
    # reason -> op type -> number of float nodes kept in float32 for that reason
    kept_fp32: dict[str, dict[str, int]]
    # node name -> reason, for every float node kept in float32
    kept_fp32_nodes: dict[str, str]
    casts_added: int
    initializers_fp16: int
    initializers_fp32: int
    keep_io_types: bool
    external_data: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        kept = ", ".join(f"{reason} {sum(ops.values())} ({', '.join(f'{op} {n}' for op, n in sorted(ops.items()))})"
                         for reason, ops in self.kept_fp32.items())
        return (f"fp16: {self.fp16_nodes} of {self.nodes} nodes in fp16, {self.fp32_nodes} kept in fp32"
                f"{': ' + kept if kept else ''}; {self.other_nodes} others (constants, Shape, integer ops); "
                f"{self.casts_added} casts added; converted by {self.converter}")


def fp16_model(model_path: Path, out_path: Path, *, keep_fp32_op_types: Iterable[str] = (),
               keep_fp32_nodes: Iterable[str] = (), keep_io_types: bool = True,
               precision_sensitive_ops: Iterable[str] = PRECISION_SENSITIVE_OPS,
               convert_subgraphs: bool = True) -> Fp16Report:
    """Write a type-correct mixed fp16/fp32 copy of ``model_path`` to ``out_path`` for a strongly typed build.

    ``keep_fp32_op_types`` and ``keep_fp32_nodes`` keep more in float32; a node name the model does not
    have is a SpecInvalid. With ``keep_io_types`` the float32 inputs and outputs stay float32, with
    casts inside. The bodies of If/Loop/Scan are converted by the same rules with float32 at their
    boundaries (``convert_subgraphs``), or kept float32 whole. ONNX Runtime's float16 converter
    rewrites each graph. Raises BuildFailed when the result is not a valid, type-correct model.
    """
    model_path, out_path = Path(model_path), Path(out_path)
    model = onnx.load(str(model_path), load_external_data=False)
    missing = set(keep_fp32_nodes) - set(_all_node_names(model.graph))
    if missing:
        raise SpecInvalid(f"keep_fp32_nodes names nodes the model does not have: {sorted(missing)}",
                          problems=[{"field": "keep_fp32_nodes", "message": f"no node named {name!r}"}
                                    for name in sorted(missing)])
    tally = _Tally()
    _prepare(model, tally.notes)
    model = onnx.shape_inference.infer_shapes(model)
    reader = _TensorReader(model_path.resolve().parent)
    opts = _Options(keep_ops=set(keep_fp32_op_types), keep_nodes=set(keep_fp32_nodes),
                    sensitive_ops=set(precision_sensitive_ops), reader=reader,
                    opset_import=list(model.opset_import), ir_version=model.ir_version)
    if convert_subgraphs:
        _move_weights_into_bodies(model.graph)
        all_types: dict[str, int] = {}
        for graph in _all_graphs(model.graph):
            all_types.update(_tensor_types(graph))
        _convert_subgraphs(model.graph, all_types, opts, tally)

    sources = {reader.location(t)[0] for t in _all_tensors(model) if uses_external_data(t)}
    data_name = _free_file_name(out_path, sources) if sources else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = _convert_graph(model, opts, tally, keep_io_types=keep_io_types,
                           write=lambda m, names: _write_initializers(m, names, reader, out_path.parent, data_name))
    large = data_name is None and model.ByteSize() > _INLINE_LIMIT
    if large:
        data_name = _free_file_name(out_path, sources)
    onnx.save_model(model, str(out_path), save_as_external_data=large, all_tensors_to_one_file=True,
                    location=data_name if large else None, size_threshold=1024)
    _check(out_path)

    gemms = sorted(name for name in tally.kept_nodes if name in tally.gemm_nodes)
    if gemms:
        tally.notes.append(f"MatMul/Gemm kept in float32 ({', '.join(gemms[:5])}{', ...' if len(gemms) > 5 else ''}): "
                           "TensorRT-RTX builds no float32 GEMM for Turing (sm75)")
    report = Fp16Report(
        converter=tally.library, nodes=tally.nodes, fp16_nodes=tally.float_nodes - len(tally.kept_nodes),
        fp32_nodes=len(tally.kept_nodes), other_nodes=tally.nodes - tally.float_nodes,
        kept_fp32={r: dict(tally.kept[r]) for r in REASONS if r in tally.kept}, kept_fp32_nodes=tally.kept_nodes,
        casts_added=tally.casts, initializers_fp16=tally.initializers_fp16,
        initializers_fp32=tally.initializers_fp32,
        keep_io_types=keep_io_types, external_data=data_name, notes=tally.notes)
    log.info("%s", report.summary())
    return report


@dataclass
class _Options:
    keep_ops: set[str]
    keep_nodes: set[str]
    sensitive_ops: set[str]
    reader: _TensorReader
    opset_import: list[Any]
    ir_version: int


@dataclass
class _Tally:
    """Counts over every graph converted."""

    nodes: int = 0
    float_nodes: int = 0
    kept: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    kept_nodes: dict[str, str] = field(default_factory=dict)
    casts: int = 0
    library: str = ""
    notes: list[str] = field(default_factory=list)
    gemm_nodes: set[str] = field(default_factory=set)
    initializers_fp16: int = 0
    initializers_fp32: int = 0

    def add(self, nodes: list[tuple[str, str, bool]], reasons: dict[str, str], casts: int) -> None:
        """``nodes``: (name, op type, computes on float32) for each node of the source graph."""
        self.nodes += len(nodes)
        self.casts += casts
        for name, op_type, is_float in nodes:
            if not is_float:
                continue
            if op_type in ("MatMul", "Gemm"):
                self.gemm_nodes.add(name)
            self.float_nodes += 1
            if name in reasons:
                self.kept[reasons[name]][op_type] += 1
                self.kept_nodes[name] = reasons[name]

    def merge(self, other: _Tally) -> None:
        self.nodes += other.nodes
        self.float_nodes += other.float_nodes
        self.casts += other.casts
        for reason, ops in other.kept.items():
            self.kept[reason].update(ops)
        self.kept_nodes.update(other.kept_nodes)
        self.gemm_nodes |= other.gemm_nodes
        self.initializers_fp16 += other.initializers_fp16
        self.initializers_fp32 += other.initializers_fp32
        self.library = self.library or other.library
        self.notes.extend(other.notes)


def _convert_graph(model: ModelProto, opts: _Options, tally: _Tally, *, keep_io_types: bool,
                   write: Any) -> ModelProto:
    """Convert the main graph of a shape-inferred ``model``; its control-flow nodes keep float32 boundaries.

    ``write(model, names)`` turns the named initializers into fp16 (and stores them) before the
    library rewrites the graph; it returns the numbers of float initializers made fp16 and kept.
    """
    opset = _opset(model)
    types = _tensor_types(model.graph)
    reasons = classify(model, types, keep_ops=opts.keep_ops, keep_nodes=opts.keep_nodes,
                       sensitive_ops=opts.sensitive_ops, reader=opts.reader)
    source = [(n.name, n.op_type, _is_float_node(n, types)) for n in model.graph.node]
    blocked = set(reasons)
    _split_shared_constants(model, blocked, types)
    _cast_outer_scope_inputs(model, blocked, types)
    n_fp16, n_fp32 = write(model, _fp16_initializers(model, blocked))
    tally.initializers_fp16 += n_fp16
    tally.initializers_fp32 += n_fp32

    before = {n.name: list(n.output) for n in model.graph.node}
    model, tally.library = _run_converter(model, blocked, keep_io_types)
    added = {n.name for n in model.graph.node if n.name not in before}
    _fold_round_trips(model, added, opset)
    _restore_names(model.graph, added, before)
    _topological_sort(model.graph)
    del model.graph.value_info[:]
    casts = sum(1 for n in model.graph.node if n.name in added or n.name.endswith("__fp32_outer"))
    tally.add(source, reasons, casts)
    return model


def _move_weights_into_bodies(graph: GraphProto) -> None:
    """Float initializers that only control-flow bodies read become initializers of those bodies, so
    a body converts them to fp16 itself rather than casting float32 weights each time it runs."""
    explicit = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    weights = {t.name: t for t in graph.initializer if t.data_type == FLOAT and t.name not in explicit}
    moved: set[str] = set()
    for node in graph.node:
        if node.op_type not in _CONTROL_FLOW:
            continue
        for attr in node.attribute:
            for sub in _attr_graphs(attr):
                mapping = {}
                for name in sorted(n for n in _free_names(sub) if n in weights):
                    copy = TensorProto()
                    copy.CopyFrom(weights[name])
                    copy.name = mapping[name] = f"{node.name}.{attr.name}/{name}"
                    sub.initializer.append(copy)
                _rename_in_graph(sub, mapping)
                moved.update(mapping)
    for tensor in [t for t in graph.initializer if t.name in moved]:
        graph.initializer.remove(tensor)


def _convert_subgraphs(graph: GraphProto, all_types: dict[str, int], opts: _Options, tally: _Tally) -> None:
    """Convert the bodies of the control-flow nodes in ``graph``, innermost first, in place."""
    for node in graph.node:
        if node.op_type not in _CONTROL_FLOW:
            continue
        for attr in node.attribute:
            for sub in _attr_graphs(attr):
                _convert_subgraphs(sub, all_types, opts, tally)
                _convert_body(node, attr.name, sub, all_types, opts, tally)


def _convert_body(owner: NodeProto, attr_name: str, sub: GraphProto, all_types: dict[str, int],
                  opts: _Options, tally: _Tally) -> None:
    """Convert one subgraph as a model of its own whose inputs are its formal inputs and the outer
    tensors it reads, all float32 at the boundary. Left as it is (float32) when that fails."""
    where = f"{owner.name}.{attr_name}"
    free = _free_names(sub)
    unknown = sorted(n for n in free if n not in all_types)
    if unknown:
        tally.notes.append(f"{where} kept in float32: outer tensors of unknown type {unknown[:5]}")
        return
    model = helper.make_model(GraphProto(), opset_imports=opts.opset_import, ir_version=opts.ir_version)
    graph = model.graph
    graph.CopyFrom(sub)
    formal = [i.name for i in graph.input]
    produced = {o for n in graph.node for o in n.output}
    for out in graph.output:
        if out.name not in produced:  # an input or outer tensor passed straight through
            ident = helper.make_node("Identity", [out.name], [f"{where}/{out.name}"], name=f"{where}/{out.name}")
            graph.node.append(ident)
            out.name = ident.output[0]
    for name in sorted(free):
        graph.input.append(helper.make_tensor_value_info(name, all_types[name], None))
    old_tensors = {x for n in graph.node for x in n.output} | {i.name for i in graph.input} | \
        {t.name for t in graph.initializer}
    old_nodes = {n.name for n in graph.node}
    local = _Tally()
    try:
        model = onnx.shape_inference.infer_shapes(model)
        model = _convert_graph(model, opts, local, keep_io_types=True,
                               write=lambda m, names: _convert_initializers_in_memory(m, names, opts.reader))
        _prefix_new_names(model.graph, old_tensors, old_nodes, f"{where}/")
        onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the body in float32
        tally.notes.append(f"{where} kept in float32: {str(exc).strip()[:300]}")
        return
    inputs = [i for i in model.graph.input if i.name in formal]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    sub.CopyFrom(model.graph)
    tally.merge(local)


def _prefix_new_names(graph: GraphProto, old_tensors: set[str], old_nodes: set[str], prefix: str) -> None:
    """Names the conversion created (graph_input_cast_0, x_cast_to_fp32...) made unique in the model."""
    outputs = {o.name for o in graph.output}
    rename = {}
    for init in graph.initializer:
        if init.name not in old_tensors:
            rename[init.name] = prefix + init.name
            init.name = rename[init.name]
    for node in graph.node:
        if node.name not in old_nodes:
            node.name = prefix + node.name
        for out in node.output:
            if out and out not in old_tensors and out not in outputs:
                rename[out] = prefix + out
    for node in graph.node:
        for i, x in enumerate(node.input):
            node.input[i] = rename.get(x, x)
        for i, x in enumerate(node.output):
            node.output[i] = rename.get(x, x)
        if node.op_type in _CONTROL_FLOW:
            _rename_in_subgraphs(node, rename)


def _convert_initializers_in_memory(model: ModelProto, fp16_inits: set[str],
                                    reader: _TensorReader) -> tuple[int, int]:
    n_fp16 = n_fp32 = 0
    for tensor in model.graph.initializer:
        if tensor.name in fp16_inits:
            _set_raw(tensor, b"".join(reader.fp16_chunks(tensor)), FLOAT16)
            n_fp16 += 1
        elif tensor.data_type == FLOAT:
            n_fp32 += 1
    return n_fp16, n_fp32


# ----------------------------------------------------------------------------------------------
# Which nodes stay float32


def classify(model: ModelProto, types: dict[str, int], *, keep_ops: set[str] = frozenset(),
             keep_nodes: set[str] = frozenset(), sensitive_ops: set[str] = PRECISION_SENSITIVE_OPS,
             reader: _TensorReader | None = None) -> dict[str, str]:
    """Node name -> reason, for the main-graph nodes that must stay float32.

    ``types`` maps tensor names to ONNX element types (after shape inference). Nodes must have
    unique names. Nodes without float tensors may appear too; they are unaffected by conversion.
    """
    graph = model.graph
    nodes = list(graph.node)
    opset = _opset(model)
    reader = reader or _TensorReader(Path("."))
    consumers = _consumers(graph)
    const = _constant_tensors(graph)
    reasons: dict[str, str] = {}

    def keep(node: NodeProto, reason: str) -> None:
        reasons.setdefault(node.name, reason)

    for node in nodes:
        if node.name in keep_nodes:
            keep(node, USER_NODE)
        elif node.op_type in keep_ops:
            keep(node, USER_OP)
    for node in nodes:
        if node.op_type in _CONTROL_FLOW:
            keep(node, CONTROL_FLOW)
        elif node.domain not in _DEFAULT_DOMAINS:
            keep(node, CUSTOM_DOMAIN)
        elif node.op_type != "Constant" and not _schema_allows_fp16(node.op_type, opset):
            keep(node, NO_FP16)

    for node, reason in _shape_arithmetic(graph, consumers, const):
        keep(node, reason)

    limits: dict[str, float] = {}
    for node in nodes:
        if node.name in reasons or node.op_type == "Constant":
            continue
        for name in node.input:
            if name in const and types.get(name) == FLOAT:
                if name not in limits:
                    limits[name] = _finite_abs_max(const[name], reader)
                if limits[name] > FP16_MAX:
                    keep(node, CONST_RANGE)
                    break

    for node in nodes:
        if node.op_type in sensitive_ops:
            keep(node, SENSITIVE)
    # Carry precision-sensitive results on through element-wise ops whose other inputs are constants.
    producers = {out: n for n in nodes for out in n.output}
    fp32_out: set[str] = set()
    for node in _topological_order(graph):
        if reasons.get(node.name) in (SENSITIVE, CHAIN):
            fp32_out.update(node.output)
            continue
        if node.name in reasons or node.op_type not in _CHAIN_OPS:
            continue
        float_inputs = [x for x in node.input if x and types.get(x) == FLOAT]
        if float_inputs and any(x in fp32_out for x in float_inputs) and all(
                x in fp32_out or x in const or
                reasons.get(getattr(producers.get(x), "name", None)) in (SHAPE, SHAPE_DERIVED)
                for x in float_inputs):
            keep(node, CHAIN)
            fp32_out.update(node.output)

    # Data movement right after float32 nodes stays float32.
    for node in _topological_order(graph):
        if node.name in reasons or node.op_type not in _MOVEMENT_OPS:
            continue
        float_inputs = [x for x in node.input if x and types.get(x) == FLOAT]
        sources = [producers.get(x) for x in float_inputs if x not in const]
        if sources and all(p is not None and p.name in reasons for p in sources):
            keep(node, MOVES_FP32)

    # A Constant stays float32 when everything that reads it does.
    for node in nodes:
        if node.op_type == "Constant" and node.name not in reasons:
            uses = [u for out in node.output for u in consumers.get(out, [])]
            if uses and all(c.name in reasons or i in _float_only_inputs(c.op_type, opset) for c, i in uses):
                first = next((c for c, _ in uses if c.name in reasons), None)
                reasons[node.name] = reasons[first.name] if first is not None else SHAPE
    return reasons


def _shape_arithmetic(graph: GraphProto, consumers: dict[str, list[tuple[NodeProto, int]]],
                      const: dict[str, Any]) -> list[tuple[NodeProto, str]]:
    """Nodes computing shapes and indices: backward from shape/index inputs, forward from Shape/Size."""
    order = _topological_order(graph)
    outputs = {o.name for o in graph.output}
    shape_only: set[str] = set()
    # Backward: every use of every output is a shape/index input, or feeds a node that is itself
    # shape-only (Shape/Size do not propagate: they read dimensions, not values).
    for node in reversed(order):
        if node.op_type == "Constant" or any(o in outputs for o in node.output):
            continue
        uses = [u for out in node.output if out for u in consumers.get(out, [])]
        if uses and all(idx in SHAPE_INPUTS.get(c.op_type, ()) or
                        (c.name in shape_only and c.op_type not in _SHAPE_READERS) for c, idx in uses):
            shape_only.add(node.name)
    # Forward: computed from Shape/Size outputs and constants only.
    derived: set[str] = set()
    derived_nodes: set[str] = set()
    for node in order:
        if node.op_type in _SHAPE_READERS:
            derived.update(node.output)
            continue
        ins = [x for x in node.input if x]
        if node.op_type not in _CONTROL_FLOW and ins and any(x in derived for x in ins) and \
                all(x in derived or x in const for x in ins):
            derived.update(node.output)
            derived_nodes.add(node.name)
    found = []
    for n in order:
        if n.op_type in _SHAPE_READERS:
            continue  # type-agnostic: a cast in front of them would only copy the tensor
        if n.name in shape_only or n.op_type in INDEX_OPS:
            found.append((n, SHAPE))
        elif n.name in derived_nodes:
            found.append((n, SHAPE_DERIVED))
    return found


@functools.lru_cache(maxsize=None)
def _schema_allows_fp16(op_type: str, opset: int) -> bool:
    """Whether the ONNX schema of ``op_type`` at ``opset`` lets float16 flow where float32 does."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # noqa: BLE001 - unknown op: treat like a custom op
        return False
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    if not any("tensor(float16)" in v for v in allowed.values()):
        return False
    # An input that takes float32 but never float16 is fine only where we keep it float32: Resize's
    # scales (a constant stays float32, a computed one is read from its float32 source).
    if op_type == "Resize":
        return True
    for formal in schema.inputs:
        kinds = allowed.get(formal.type_str, {formal.type_str})
        if "tensor(float)" in kinds and "tensor(float16)" not in kinds:
            return False
    return True


def _float_only_inputs(op_type: str, opset: int) -> set[int]:
    """Input positions of an op that must stay float32 even when the op runs in fp16 (Resize scales)."""
    if op_type != "Resize":
        return set()
    return {1} if opset <= 10 else {2}


# ----------------------------------------------------------------------------------------------
# Graph preparation and rewriting


def _prepare(model: ModelProto, notes: list[str]) -> None:
    """Unique node names, initializers off the graph inputs, explicit float constants as tensors."""
    seen: set[str] = set()
    for graph in _all_graphs(model.graph):
        for i, node in enumerate(graph.node):
            name = node.name or f"{node.op_type}_{i}"
            while name in seen:
                name = f"{name}_{i}"
            node.name = name
            seen.add(name)
            if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
                # The default value is a float32 zero; make it explicit so the converter retypes it.
                node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", FLOAT, [1], [0.0])))
            if node.op_type == "Constant":
                for attr in list(node.attribute):
                    if attr.name in ("value_float", "value_floats"):
                        values = [attr.f] if attr.name == "value_float" else list(attr.floats)
                        dims = [] if attr.name == "value_float" else [len(values)]
                        node.attribute.remove(attr)
                        node.attribute.append(helper.make_attribute(
                            "value", helper.make_tensor(node.output[0], FLOAT, dims, values)))
    inits = {t.name for t in model.graph.initializer}
    # The converter retypes every float value_info to fp16, also those some exporters write for
    # initializers, which would then contradict initializers that stay float32.
    for value in [v for v in model.graph.value_info if v.name in inits]:
        model.graph.value_info.remove(value)
    shadowed = [i for i in model.graph.input if i.name in inits]
    if shadowed:
        for value in shadowed:
            model.graph.input.remove(value)
        notes.append(f"initializers listed as graph inputs were made constants: {[v.name for v in shadowed]}")


def _split_shared_constants(model: ModelProto, blocked: set[str], types: dict[str, int]) -> None:
    """Give float32 readers of a float constant that fp16 nodes also read their own float32 copy."""
    graph = model.graph
    consumers = _consumers(graph)
    inits = {t.name: t for t in graph.initializer}
    const_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    opset = _opset(model)
    for name in list(inits) + list(const_nodes):
        if types.get(name) != FLOAT:
            continue
        uses = consumers.get(name, [])
        fp32_uses = [(c, i) for c, i in uses if _reads_fp32(c, i, blocked, opset)]
        if not fp32_uses or len(fp32_uses) == len(uses):
            continue
        copy_name = f"{name}__fp32"
        if name in inits:
            copy = TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = copy_name
            graph.initializer.append(copy)
        else:
            src = const_nodes[name]
            copy_node = NodeProto()
            copy_node.CopyFrom(src)
            copy_node.name = f"{src.name}__fp32"
            del copy_node.output[:]
            copy_node.output.append(copy_name)
            graph.node.insert(list(graph.node).index(src) + 1, copy_node)
            blocked.add(copy_node.name)
        for consumer, idx in fp32_uses:
            if idx >= 0:
                consumer.input[idx] = copy_name
            else:
                _rename_in_subgraphs(consumer, {name: copy_name})
        types[copy_name] = FLOAT


def _reads_fp32(node: NodeProto, idx: int, blocked: set[str], opset: int) -> bool:
    return node.name in blocked or idx in _float_only_inputs(node.op_type, opset)


def _cast_outer_scope_inputs(model: ModelProto, blocked: set[str], types: dict[str, int]) -> None:
    """Feed float32 subgraphs of kept control-flow nodes through an explicit float32 Cast.

    A subgraph reads outer tensors by name, which the converter does not see as inputs of the node;
    a tensor that becomes fp16 outside would reach float32 code inside. That includes outputs of
    kept nodes: the converter renames them and gives their old name to an fp16 cast. The Cast added
    here is a kept node, so the converter casts its input back to float32 where needed (and the
    round trip is folded away afterwards); where its input is float32 already it is a no-op.
    """
    graph = model.graph
    producers = {out: n for n in graph.node for out in n.output}
    inits = {t.name for t in graph.initializer}
    for node in list(graph.node):
        if node.op_type not in _CONTROL_FLOW or node.name not in blocked:
            continue
        for name in sorted(_outer_refs(node)):
            if types.get(name) != FLOAT or name in inits:
                continue  # float initializers read by kept nodes stay float32 (split when shared)
            cast_out = f"{name}__fp32_outer"
            if cast_out not in producers:
                cast = helper.make_node("Cast", [name], [cast_out], to=FLOAT, name=f"{name}__fp32_outer")
                graph.node.insert(list(graph.node).index(node), cast)
                blocked.add(cast.name)
                producers[cast_out] = cast
                types[cast_out] = FLOAT
            _rename_in_subgraphs(node, {name: cast_out})


def _fp16_initializers(model: ModelProto, blocked: set[str]) -> set[str]:
    """Main-graph float initializers that only fp16 nodes read (after _split_shared_constants)."""
    graph = model.graph
    opset = _opset(model)
    consumers = _consumers(graph)
    out = set()
    for init in graph.initializer:
        if init.data_type != FLOAT:
            continue
        uses = consumers.get(init.name, [])
        if uses and not any(_reads_fp32(c, i, blocked, opset) for c, i in uses):
            out.add(init.name)
    return out


def _run_converter(model: ModelProto, blocked: set[str], keep_io_types: bool) -> tuple[ModelProto, str]:
    """ONNX Runtime's converter with our block list (and none of its default op block list)."""
    import onnxruntime
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(model, keep_io_types=keep_io_types, disable_shape_infer=True,
                                     op_block_list=[], node_block_list=sorted(blocked), max_finite_val=FP16_MAX)
    return model, f"onnxruntime.transformers.float16 (onnxruntime {onnxruntime.__version__})"


def _fold_round_trips(model: ModelProto, added: set[str], opset: int) -> None:
    """Undo the float32 -> fp16 -> float32 round trips the converter leaves between float32 nodes.

    The converter casts every float32 output of a kept node to fp16 and every fp16 input of a kept
    node back to float32, also when both ends are float32. Read the float32 value directly instead,
    then drop the casts that no longer do anything.
    """
    graph = model.graph
    types = _tensor_types(onnx.shape_inference.infer_shapes(model).graph)
    producers = {out: n for n in graph.node for out in n.output}
    graph_outputs = {o.name for o in graph.output}

    def fp32_source(name: str) -> str | None:
        inner = producers.get(name)
        if inner is not None and inner.name in added and inner.op_type == "Cast" and \
                _cast_to(inner) == FLOAT16 and types.get(inner.input[0]) == FLOAT:
            return inner.input[0]
        return None

    for node in graph.node:
        if node.op_type == "Cast" and _cast_to(node) == FLOAT:
            node.input[0] = fp32_source(node.input[0]) or node.input[0]
        # Inputs that only take float32 (Resize scales) read a float32 source directly.
        for i in _float_only_inputs(node.op_type, opset):
            if i < len(node.input) and node.input[i]:
                node.input[i] = fp32_source(node.input[i]) or node.input[i]
        # Shape and Size read dimensions only: no cast in front of them.
        if node.op_type in _SHAPE_READERS and node.input:
            cast = producers.get(node.input[0])
            if cast is not None and cast.name in added and cast.op_type == "Cast":
                node.input[0] = cast.input[0]
    # Added casts to float32 of what is float32 already: readers take the input directly.
    alias: dict[str, str] = {}
    for node in graph.node:
        if node.name in added and node.op_type == "Cast" and _cast_to(node) == FLOAT and \
                types.get(node.input[0]) == FLOAT and node.output[0] not in graph_outputs:
            alias[node.output[0]] = node.input[0]
    if alias:
        for node in graph.node:
            for i, name in enumerate(node.input):
                while name in alias:
                    name = alias[name]
                node.input[i] = name
    # Identical added casts of one tensor (a kept reader and a graph output both wanting float32): one is enough.
    canonical: dict[tuple[str, int | None], str] = {}
    for node in sorted((n for n in graph.node if n.name in added and n.op_type == "Cast"),
                       key=lambda n: n.output[0] not in graph_outputs):
        canonical.setdefault((node.input[0], _cast_to(node)), node.output[0])
    same = {n.output[0]: canonical[(n.input[0], _cast_to(n))] for n in graph.node
            if n.name in added and n.op_type == "Cast" and n.output[0] not in graph_outputs
            and canonical[(n.input[0], _cast_to(n))] != n.output[0]}
    if same:
        for node in graph.node:
            for i, name in enumerate(node.input):
                node.input[i] = same.get(name, name)
            if node.op_type in _CONTROL_FLOW:
                _rename_in_subgraphs(node, same)
    # Outer-scope casts of what stayed float32: subgraphs read the tensor itself again.
    for node in list(graph.node):
        if node.name.endswith("__fp32_outer") and types.get(node.input[0]) == FLOAT:
            for reader in graph.node:
                if reader.op_type in _CONTROL_FLOW and node.output[0] in _outer_refs(reader):
                    _rename_in_subgraphs(reader, {node.output[0]: node.input[0]})
            graph.node.remove(node)
    # A float32 -> float32 cast in front of a graph output: the producer writes the output itself.
    _drop_unread_casts(graph, added)
    readers = Counter(x for n in graph.node for x in n.input)
    implicit = set().union(*(_outer_refs(n) for n in graph.node if n.op_type in _CONTROL_FLOW))
    producers = {out: n for n in graph.node for out in n.output}
    for node in list(graph.node):
        src = node.input[0] if node.input else ""
        if node.name in added and node.op_type == "Cast" and _cast_to(node) == FLOAT and \
                types.get(src) == FLOAT and node.output[0] in graph_outputs and src in producers and \
                src not in graph_outputs and readers[src] == 1 and src not in implicit:
            producer = producers[src]
            producer.output[list(producer.output).index(src)] = node.output[0]
            graph.node.remove(node)
    _drop_unread_casts(graph, added)


def _restore_names(graph: GraphProto, added: set[str], before: dict[str, list[str]]) -> None:
    """Give outputs the converter renamed (``x`` -> ``x_cast_to_fp16``, ``node_output_cast_0``...)
    their names back where the fp16 copy that took the name is gone, so logs and errors name the
    model's own tensors."""
    names = {x for n in graph.node for x in list(n.input) + list(n.output)} | {o.name for o in graph.output}
    for n in graph.node:
        if n.op_type in _CONTROL_FLOW:
            names |= _outer_refs(n)
    rename: dict[str, str] = {}
    for node in graph.node:
        original = before.get(node.name)
        if node.name in added or original is None or len(original) != len(node.output):
            continue
        for now, was in zip(node.output, original, strict=True):
            if now != was and was and was not in names and was not in rename.values():
                rename[now] = was
    if not rename:
        return
    for node in graph.node:
        for i, x in enumerate(node.input):
            node.input[i] = rename.get(x, x)
        for i, x in enumerate(node.output):
            node.output[i] = rename.get(x, x)
        if node.op_type in _CONTROL_FLOW:
            _rename_in_subgraphs(node, rename)


def _drop_unread_casts(graph: GraphProto, added: set[str]) -> None:
    """Remove added casts nobody reads (explicitly, or from inside a subgraph)."""
    graph_outputs = {o.name for o in graph.output}
    while True:
        used = {x for n in graph.node for x in n.input} | graph_outputs
        for n in graph.node:
            if n.op_type in _CONTROL_FLOW:
                used |= _outer_refs(n)
        dead = [n for n in graph.node if n.name in added and n.op_type == "Cast" and n.output[0] not in used]
        if not dead:
            return
        for n in dead:
            graph.node.remove(n)


def _topological_sort(graph: GraphProto) -> None:
    """Order nodes so every input is produced before it is read, keeping the given order where possible."""
    nodes = list(graph.node)
    ordered = _topological_order(graph)
    if len(ordered) != len(nodes):
        raise BuildFailed("fp16 conversion produced a graph with a cycle or a dangling input")
    del graph.node[:]
    graph.node.extend(ordered)


def _topological_order(graph: GraphProto) -> list[NodeProto]:
    nodes = list(graph.node)
    producer_index = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    deps: list[set[int]] = []
    for n in nodes:
        names = set(x for x in n.input if x)
        if n.op_type in _CONTROL_FLOW:
            names |= _outer_refs(n)
        deps.append({producer_index[x] for x in names if x in producer_index})
    readers: dict[int, list[int]] = defaultdict(list)
    for i, d in enumerate(deps):
        for j in d:
            readers[j].append(i)
    waiting = [len(d) for d in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    return order


def _check(path: Path) -> None:
    """The saved model must pass the checker and strict, type-checking shape inference."""
    try:
        onnx.checker.check_model(str(path))
        onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False),
                                          strict_mode=True, check_type=True)
    except Exception as exc:  # noqa: BLE001 - checker and inference raise several types
        raise BuildFailed(f"the fp16 conversion produced an invalid model: {str(exc).strip()[:2000]}") from exc


# ----------------------------------------------------------------------------------------------
# Initializer data (inline or external)


class _TensorReader:
    """Reads tensor data, from the proto or from external data files under the model's directory,
    in chunks, so a large weight never has to be in memory whole (nor several copies of it)."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir.resolve()

    def location(self, tensor: TensorProto) -> tuple[Path, int, int | None]:
        info = ExternalDataInfo(tensor)
        path = (self.base_dir / info.location).resolve()
        if not path.is_relative_to(self.base_dir):
            raise BuildFailed(f"external data of {tensor.name!r} lies outside the model's directory")
        return path, int(info.offset or 0), (int(info.length) if info.length else None)

    def flat(self, tensor: TensorProto) -> np.ndarray:
        """The tensor's values as a 1-D array: a read-only memory map for external data."""
        if not uses_external_data(tensor):
            return np.ravel(numpy_helper.to_array(tensor))
        path, offset, length = self.location(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if length is not None and length != count * dtype.itemsize:
            raise BuildFailed(f"external data of {tensor.name!r} has {length} bytes, its shape needs "
                              f"{count * dtype.itemsize}")
        if count == 0:
            return np.zeros(0, dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))

    def chunks(self, tensor: TensorProto) -> Iterator[np.ndarray]:
        flat = self.flat(tensor)
        for start in range(0, flat.size, _CHUNK):
            yield np.array(flat[start:start + _CHUNK])
        del flat

    def raw_chunks(self, tensor: TensorProto) -> Iterator[bytes]:
        for chunk in self.chunks(tensor):
            yield chunk.tobytes()

    def fp16_chunks(self, tensor: TensorProto) -> Iterator[bytes]:
        """The float32 tensor converted to fp16, saturating at +-65504 like the converter does."""
        from onnxruntime.transformers.float16 import convert_np_to_float16

        for chunk in self.chunks(tensor):
            # Always 1-D: the library's clamping indexes with np.where, which numpy 2 refuses on 0-d arrays.
            yield convert_np_to_float16(chunk.astype(np.float32), 5.96e-08, FP16_MAX).tobytes()


def _finite_abs_max(source: TensorProto | NodeProto, reader: _TensorReader) -> float:
    tensor = source if isinstance(source, TensorProto) else _constant_value(source)
    if tensor is None or tensor.data_type != FLOAT:
        return 0.0
    top = 0.0
    for chunk in reader.chunks(tensor):
        values = np.abs(chunk)
        # inf and the float32 extremes used as mask fills (-3.4e38 = finfo(float32).min) are sentinels:
        # the conversion saturates them to +-65504, which still masks in fp16.
        values = values[values < _SENTINEL]
        if values.size:
            top = max(top, float(values.max()))
    return top


def _write_initializers(model: ModelProto, fp16_inits: set[str], reader: _TensorReader, out_dir: Path,
                        data_name: str | None) -> tuple[int, int]:
    """Convert the fp16-bound initializers; with external data, stream every external tensor to ``data_name``.

    Returns the numbers of main-graph float initializers made fp16 and kept float32.
    """
    # Constant tensors of the main graph are rewritten by the converter in memory: load them.
    for node in model.graph.node:
        for attr in node.attribute:
            tensors = [attr.t] if attr.type == AttributeProto.TENSOR else list(attr.tensors)
            for tensor in tensors:
                if uses_external_data(tensor):
                    _set_raw(tensor, b"".join(reader.raw_chunks(tensor)), tensor.data_type)
    n_fp16 = n_fp32 = 0
    fh = open(out_dir / data_name, "wb") if data_name is not None else None  # noqa: SIM115 - closed below
    try:
        for tensor in model.graph.initializer:
            convert = tensor.name in fp16_inits
            n_fp16 += convert
            n_fp32 += not convert and tensor.data_type == FLOAT
            if fh is not None and uses_external_data(tensor):
                # Straight from the source file to the new one, never whole in memory (nor in the proto).
                _append(fh, tensor, data_name, reader.fp16_chunks(tensor) if convert else reader.raw_chunks(tensor),
                        FLOAT16 if convert else tensor.data_type)
            elif convert:
                _set_raw(tensor, b"".join(reader.fp16_chunks(tensor)), FLOAT16)
        # Subgraph tensors still on disk are copied as they are.
        for graph in list(_all_graphs(model.graph))[1:]:
            tensors = list(graph.initializer) + [t for n in graph.node for a in n.attribute
                                                 for t in ([a.t] if a.type == AttributeProto.TENSOR else a.tensors)]
            for tensor in tensors:
                if fh is not None and uses_external_data(tensor):
                    _append(fh, tensor, data_name, reader.raw_chunks(tensor), tensor.data_type)
    finally:
        if fh is not None:
            fh.close()
    return n_fp16, n_fp32


def _append(fh, tensor: TensorProto, data_name: str, chunks: Iterable[bytes], data_type: int) -> None:
    """Write ``chunks`` at the end of the open data file and point ``tensor`` (now ``data_type``) at them."""
    pad = (-fh.tell()) % _ALIGN
    fh.write(b"\0" * pad)
    offset = fh.tell()
    for chunk in chunks:
        fh.write(chunk)
    length = fh.tell() - offset
    for name in ("float_data", "int32_data", "raw_data"):
        tensor.ClearField(name)
    del tensor.external_data[:]
    for key, value in (("location", data_name), ("offset", offset), ("length", length)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.data_type = data_type


def _set_raw(tensor: TensorProto, raw: bytes, data_type: int) -> None:
    for name in ("float_data", "int32_data", "raw_data"):
        tensor.ClearField(name)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT
    tensor.data_type = data_type
    tensor.raw_data = raw


def _free_file_name(out_path: Path, taken: set[Path]) -> str:
    """A data file name beside ``out_path`` that is none of the source's external data files."""
    name, i = f"{out_path.name}.data", 1
    while (out_path.parent / name).resolve() in taken:
        name, i = f"{out_path.name}.{i}.data", i + 1
    return name


# ----------------------------------------------------------------------------------------------
# Graph helpers


def _opset(model: ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            return imp.version
    return 1


def _all_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in _attr_graphs(attr):
                yield from _all_graphs(sub)


def _attr_graphs(attr: AttributeProto) -> list[GraphProto]:
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _all_node_names(graph: GraphProto) -> Iterator[str]:
    for g in _all_graphs(graph):
        for node in g.node:
            yield node.name


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    for g in _all_graphs(model.graph):
        yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == AttributeProto.TENSORS:
                    yield from attr.tensors


def _outer_refs(node: NodeProto) -> set[str]:
    """Names a node's subgraphs read from enclosing scopes."""
    refs: set[str] = set()
    for attr in node.attribute:
        for g in _attr_graphs(attr):
            refs |= _free_names(g)
    return refs


def _free_names(graph: GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
              {t.values.name for t in graph.sparse_initializer}
    used: set[str] = {o.name for o in graph.output}
    for node in graph.node:
        used.update(x for x in node.input if x)
        for attr in node.attribute:
            for g in _attr_graphs(attr):
                used |= _free_names(g)
        defined.update(node.output)
    return used - defined


def _rename_in_subgraphs(node: NodeProto, mapping: dict[str, str]) -> None:
    """Make the subgraphs of ``node`` read outer tensors under new names (old name -> new name)."""
    for attr in node.attribute:
        for g in _attr_graphs(attr):
            _rename_in_graph(g, mapping)


def _rename_in_graph(graph: GraphProto, mapping: dict[str, str]) -> None:
    """Make ``graph`` and the graphs nested in it read tensors under new names."""
    if not mapping:
        return
    for sub in _all_graphs(graph):
        for n in sub.node:
            for i, x in enumerate(n.input):
                if x in mapping:
                    n.input[i] = mapping[x]
        for out in sub.output:
            if out.name in mapping:
                # A graph output that is the renamed tensor itself: route it through an Identity.
                old = out.name
                ident = helper.make_node("Identity", [mapping[old]], [f"{old}__{sub.name}_out"],
                                         name=f"{old}__{sub.name}_out")
                sub.node.append(ident)
                out.name = ident.output[0]


def _consumers(graph: GraphProto) -> dict[str, list[tuple[NodeProto, int]]]:
    """Tensor name -> (reading node, input position); -1 for reads from inside a subgraph."""
    out: dict[str, list[tuple[NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name:
                out[name].append((node, i))
        if node.op_type in _CONTROL_FLOW:
            for name in _outer_refs(node):
                out[name].append((node, -1))
    return out


def _constant_tensors(graph: GraphProto) -> dict[str, TensorProto | NodeProto]:
    const: dict[str, TensorProto | NodeProto] = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            const[node.output[0]] = node
    return const


def _constant_value(node: NodeProto) -> TensorProto | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            return attr.t
    return None


def _tensor_types(graph: GraphProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    for node in graph.node:
        if node.op_type == "Constant":
            value = _constant_value(node)
            if value is not None:
                types[node.output[0]] = value.data_type
    return types


def _is_float_node(node: NodeProto, types: dict[str, int]) -> bool:
    """Whether a node computes on float32 tensors (Constant nodes and Shape/Size do not)."""
    if node.op_type == "Constant" or node.op_type in _SHAPE_READERS:
        return False
    names = [x for x in node.input if x] + [x for x in node.output if x]
    if node.op_type in _CONTROL_FLOW:
        names += list(_outer_refs(node))
    return any(types.get(x) == FLOAT for x in names)


def _cast_to(node: NodeProto) -> int | None:
    for attr in node.attribute:
        if attr.name == "to":
            return attr.i
    return None
