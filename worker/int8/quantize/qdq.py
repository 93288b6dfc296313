"""Checking a Q/DQ model against the rules TensorRT holds it to: symmetric int8 zero points, a dequantized
constant only into a weighted operation, a quantized constant only into DequantizeLinear."""

from __future__ import annotations

import numpy as np
from onnx import GraphProto, ModelProto, TensorProto, numpy_helper

from enginefarm.core.errors import BuildFailed
from enginefarm.graph.graphfacts import QDQ_OPS
from worker.rewrite.onnxgraph import consumers

# The weighted operations TensorRT runs in int8 when their inputs come through Q/DQ.
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# The operations a dequantized activation may feed: the weighted ones, and residual Adds TensorRT fuses.
QUANTIZED_OPS = frozenset({*WEIGHTED_OPS, "Add"})


def float_for_other_readers(model: ModelProto) -> bool:
    """Give the readers of a dequantized activation that are not weighted ops (Resize, Concat, a residual Add)
    the float tensor back: the quantizer hands its DequantizeLinear to every reader, and Q/DQ belongs on the
    inputs of weighted ops only. Returns whether anything changed."""
    graph = model.graph
    original = {after: before for before, after in qdq_pairs(graph)}
    changed = False
    for node in graph.node:
        if node.op_type in WEIGHTED_OPS or node.op_type in QDQ_OPS:
            continue
        for slot, name in enumerate(node.input):
            if name in original:
                node.input[slot] = original[name]
                changed = True
    while True:  # Q/DQ pairs nothing reads any more go
        read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in QDQ_OPS and n.output[0] not in read]
        if not dead:
            return changed
        for node in dead:
            graph.node.remove(node)


def qdq_pairs(graph: GraphProto) -> list[tuple[str, str]]:
    """(float tensor before QuantizeLinear, float tensor after its DequantizeLinear) for each activation pair."""
    quantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    return [
        (quantized[n.input[0]], n.output[0])
        for n in graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in quantized
    ]


def check_for_tensorrt(model: ModelProto) -> None:
    """Guarantee what TensorRT requires of the Q/DQ graph, naming the node that breaks a rule."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    readers = consumers(graph, deep=True)
    for node in graph.node:
        if node.op_type not in QDQ_OPS:
            continue
        zp = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zp is None or zp.data_type != TensorProto.INT8 or np.any(numpy_helper.to_array(zp)):
            raise BuildFailed(f"quantizer produced {node.op_type} {node.name!r} without a zero int8 zero point")
        if node.op_type == "DequantizeLinear":
            # A dequantized constant is a weight: only a weighted op takes it (into Add or Mul, TensorRT
            # refuses it as "Quantized constant ... is only allowed before DQ"). Activations may also feed Add.
            allowed = frozenset(WEIGHTED_OPS) if node.input[0] in inits else QUANTIZED_OPS
            for user, _ in readers.get(node.output[0], []):
                if user.op_type not in allowed:
                    raise BuildFailed(
                        f"quantizer placed DequantizeLinear {node.name!r} before {user.op_type} "
                        f"{user.name!r}; only {', '.join(sorted(allowed))} take it for TensorRT"
                    )
    for tensor in graph.initializer:
        users = readers.get(tensor.name, [])
        if tensor.data_type != TensorProto.INT8 or not any(u.op_type == "DequantizeLinear" for u, _ in users):
            continue  # not a quantized constant (an int8 table of the model's own is none of ours)
        for user, slot in users:
            if user.op_type in QDQ_OPS and slot in (1, 2):
                continue  # a zero point
            if user.op_type != "DequantizeLinear" or slot != 0:
                raise BuildFailed(
                    f"quantized constant {tensor.name!r} feeds {user.op_type} {user.name!r}; "
                    f"TensorRT takes a quantized constant only into DequantizeLinear"
                )
