"""Writing the planned Q/DQ into the graph (symmetric int8: activations through QuantizeLinear and
DequantizeLinear, weights stored int8 behind a DequantizeLinear), and checking the result against the rules
TensorRT holds a Q/DQ graph to."""

from __future__ import annotations

from collections import Counter

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from enginefarm.errors import BuildFailed
from enginefarm.graph.graphfacts import QDQ_OPS
from enginefarm.worker.onnxgraph import all_nodes, consumers
from enginefarm.worker.quantize.placement import QUANTIZED_OPS, WEIGHTED_OPS, Plan

# Symmetric int8: amax maps to 127, zero point 0 (TensorRT's scheme).
_QMAX = 127


class _Names:
    """Fresh tensor and node names, never clashing with the model's own."""

    def __init__(self, model: ModelProto):
        self._used = {t.name for t in model.graph.initializer}
        for node in all_nodes(model.graph):
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


def insert_qdq(model: ModelProto, plan: Plan, amax: dict[str, float]) -> dict[str, int]:
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
    still = {name for n in all_nodes(graph) for name in n.input} | {o.name for o in graph.output}
    drop = replaced - still
    if drop:
        for field_ in (graph.initializer, graph.input):  # an initializer listed as input goes with it
            kept = [v for v in field_ if v.name not in drop]
            del field_[:]
            field_.extend(kept)
    return dict(sorted(counts.items()))


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
                    raise BuildFailed(f"quantizer placed DequantizeLinear {node.name!r} before {user.op_type} "
                                      f"{user.name!r}; only {', '.join(sorted(allowed))} take it for TensorRT")
    for tensor in graph.initializer:
        users = readers.get(tensor.name, [])
        if tensor.data_type != TensorProto.INT8 or not any(u.op_type == "DequantizeLinear" for u, _ in users):
            continue  # not a quantized constant (an int8 table of the model's own is none of ours)
        for user, slot in users:
            if user.op_type in QDQ_OPS and slot in (1, 2):
                continue  # a zero point
            if user.op_type != "DequantizeLinear" or slot != 0:
                raise BuildFailed(f"quantized constant {tensor.name!r} feeds {user.op_type} {user.name!r}; "
                                  f"TensorRT takes a quantized constant only into DequantizeLinear")
