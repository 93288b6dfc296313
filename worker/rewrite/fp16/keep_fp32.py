"""Which nodes of a graph stay float32 in the fp16 conversion, and why (the reason names below).

What stays float32, in order of precedence: nodes and op types the user names; control-flow nodes
(If/Loop/Scan, whose bodies are converted on their own); ops of other domains; ops whose ONNX schema has no
float16 at the model's opset; shape and index arithmetic; readers of constants beyond fp16's range;
precision-sensitive ops, the element-wise ops that carry their results on, and data movement fed only by
float32 nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import GraphProto, ModelProto, NodeProto, TensorProto

from worker.rewrite.fp16.weights import FLOAT, FP16_MAX, TensorReader
from worker.rewrite.onnxgraph import (
    CONTROL_FLOW_OPS,
    DEFAULT_DOMAINS,
    constant_tensors,
    constant_value,
    consumers,
    default_opset,
    reads,
    topological_order,
)

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
PRECISION_SENSITIVE_OPS: frozenset[str] = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceProd",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "GlobalAveragePool",
        "Exp",
        "Log",
        "Pow",
        "CumSum",
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "RMSNormalization",
        "LpNormalization",
        "MeanVarianceNormalization",
    }
)

# Inputs that carry shapes, indices, axes or counts rather than data: op type -> input positions.
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(idx)
    for op, idx in {
        "Reshape": {1},
        "Expand": {1},
        "Tile": {1},
        "ConstantOfShape": {0},
        "Slice": {1, 2, 3, 4},
        "Resize": {1, 2, 3},
        "Upsample": {1},
        "Squeeze": {1},
        "Unsqueeze": {1},
        "Split": {1},
        "Pad": {1, 3},
        "TopK": {1},
        "OneHot": {1},
        "Trilu": {1},
        "CumSum": {1},
        "Compress": {1},
        "Gather": {1},
        "GatherElements": {1},
        "GatherND": {1},
        "Scatter": {1},
        "ScatterElements": {1},
        "ScatterND": {1},
        "Range": {0, 1, 2},
        "NonMaxSuppression": {2, 3, 4},
        "RoiAlign": {2},
        "MaxUnpool": {2},
        "CenterCropPad": {1},
        "Col2Im": {1, 2},
        "DFT": {1, 2},
        "STFT": {1, 2},
        "ReduceSum": {1},
        "ReduceMean": {1},
        "ReduceMax": {1},
        "ReduceMin": {1},
        "ReduceProd": {1},
        "ReduceSumSquare": {1},
        "ReduceL1": {1},
        "ReduceL2": {1},
        "ReduceLogSum": {1},
        "ReduceLogSumExp": {1},
    }.items()
}
# Index computations kept in fp32 themselves: their outputs are positions or counts.
INDEX_OPS: frozenset[str] = frozenset({"Range", "NonZero"})
# Read only the dimensions of their input; they never need a cast.
SHAPE_READERS = frozenset({"Shape", "Size"})
# Ops that only move or select data: kept in float32 when all their float inputs come from float32
# nodes, so a float32 result is not rounded to fp16 on its way to the outputs or to other float32 nodes.
_MOVEMENT_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Concat",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "Split",
        "Expand",
        "Tile",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
# Element-wise ops that carry a precision-sensitive fp32 result on while their other inputs are constants.
_CHAIN_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Neg", "Abs", "Max", "Min", "Clip", "Identity"}
)
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
REASONS = (
    USER_NODE,
    USER_OP,
    CONTROL_FLOW,
    CUSTOM_DOMAIN,
    NO_FP16,
    SHAPE,
    SHAPE_DERIVED,
    CONST_RANGE,
    SENSITIVE,
    CHAIN,
    MOVES_FP32,
)


def classify(
    model: ModelProto,
    types: dict[str, int],
    *,
    keep_ops: AbstractSet[str] = frozenset(),
    keep_nodes: AbstractSet[str] = frozenset(),
    sensitive_ops: AbstractSet[str] = PRECISION_SENSITIVE_OPS,
    reader: TensorReader | None = None,
) -> dict[str, str]:
    """Node name -> reason, for the main-graph nodes that must stay float32.

    ``types`` maps tensor names to ONNX element types (after shape inference). Nodes must have
    unique names. Nodes without float tensors may appear too; they are unaffected by conversion.
    """
    graph = model.graph
    nodes = list(graph.node)
    opset = default_opset(model, missing=1)
    reader = reader or TensorReader(Path("."))
    users = consumers(graph)
    const = constant_tensors(graph)
    reasons: dict[str, str] = {}

    def keep(node: NodeProto, reason: str) -> None:
        reasons.setdefault(node.name, reason)

    for node in nodes:
        if node.name in keep_nodes:
            keep(node, USER_NODE)
        elif node.op_type in keep_ops:
            keep(node, USER_OP)
    for node in nodes:
        if node.op_type in CONTROL_FLOW_OPS:
            keep(node, CONTROL_FLOW)
        elif node.domain not in DEFAULT_DOMAINS:
            keep(node, CUSTOM_DOMAIN)
        elif node.op_type != "Constant" and not _schema_allows_fp16(node.op_type, opset):
            keep(node, NO_FP16)

    for node, reason in _shape_arithmetic(graph, users, const):
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
    for node in topological_order(graph):
        if reasons.get(node.name) in (SENSITIVE, CHAIN):
            fp32_out.update(node.output)
            continue
        if node.name in reasons or node.op_type not in _CHAIN_OPS:
            continue
        float_inputs = [x for x in node.input if x and types.get(x) == FLOAT]
        if (
            float_inputs
            and any(x in fp32_out for x in float_inputs)
            and all(
                x in fp32_out
                or x in const
                or (x in producers and reasons.get(producers[x].name) in (SHAPE, SHAPE_DERIVED))
                for x in float_inputs
            )
        ):
            keep(node, CHAIN)
            fp32_out.update(node.output)

    # Data movement right after float32 nodes stays float32.
    for node in topological_order(graph):
        if node.name in reasons or node.op_type not in _MOVEMENT_OPS:
            continue
        float_inputs = [x for x in node.input if x and types.get(x) == FLOAT]
        sources = [producers.get(x) for x in float_inputs if x not in const]
        if sources and all(p is not None and p.name in reasons for p in sources):
            keep(node, MOVES_FP32)

    # A Constant stays float32 when everything that reads it does.
    for node in nodes:
        if node.op_type == "Constant" and node.name not in reasons:
            uses = [u for out in node.output for u in users.get(out, [])]
            if uses and all(c.name in reasons or i in float_only_inputs(c.op_type, opset) for c, i in uses):
                first = next((c for c, _ in uses if c.name in reasons), None)
                reasons[node.name] = reasons[first.name] if first is not None else SHAPE
    return reasons


def _shape_arithmetic(
    graph: GraphProto, users: dict[str, list[tuple[NodeProto, int]]], const: dict[str, Any]
) -> list[tuple[NodeProto, str]]:
    """Nodes computing shapes and indices: backward from shape/index inputs, forward from Shape/Size."""
    order = topological_order(graph)
    outputs = {o.name for o in graph.output}
    shape_only: set[str] = set()
    # Backward: every use of every output is a shape/index input, or feeds a node that is itself
    # shape-only (Shape/Size do not propagate: they read dimensions, not values).
    for node in reversed(order):
        if node.op_type == "Constant" or any(o in outputs for o in node.output):
            continue
        uses = [u for out in node.output if out for u in users.get(out, [])]
        if uses and all(
            idx in SHAPE_INPUTS.get(c.op_type, ()) or (c.name in shape_only and c.op_type not in SHAPE_READERS)
            for c, idx in uses
        ):
            shape_only.add(node.name)
    # Forward: computed from Shape/Size outputs and constants only.
    derived: set[str] = set()
    derived_nodes: set[str] = set()
    for node in order:
        if node.op_type in SHAPE_READERS:
            derived.update(node.output)
            continue
        ins = [x for x in node.input if x]
        if (
            node.op_type not in CONTROL_FLOW_OPS
            and ins
            and any(x in derived for x in ins)
            and all(x in derived or x in const for x in ins)
        ):
            derived.update(node.output)
            derived_nodes.add(node.name)
    found = []
    for n in order:
        if n.op_type in SHAPE_READERS:
            continue  # type-agnostic: a cast in front of them would only copy the tensor
        if n.name in shape_only or n.op_type in INDEX_OPS:
            found.append((n, SHAPE))
        elif n.name in derived_nodes:
            found.append((n, SHAPE_DERIVED))
    return found


@functools.cache
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


def is_float_node(node: NodeProto, types: dict[str, int]) -> bool:
    """Whether a node computes on float32 tensors (Constant nodes and Shape/Size do not)."""
    if node.op_type == "Constant" or node.op_type in SHAPE_READERS:
        return False
    return any(types.get(x) == FLOAT for x in [*reads(node), *node.output])


def float_only_inputs(op_type: str, opset: int) -> set[int]:
    """Input positions of an op that must stay float32 even when the op runs in fp16 (Resize scales)."""
    if op_type != "Resize":
        return set()
    return {1} if opset <= 10 else {2}


def _finite_abs_max(source: TensorProto | NodeProto, reader: TensorReader) -> float:
    tensor = source if isinstance(source, TensorProto) else constant_value(source)
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
