"""Where the Q/DQ nodes go, the way TensorRT wants them: the inputs of weighted operations (activations per
tensor, constant weights per output channel) and the residual input of an Add that fuses into a quantized
Conv. The plan is made before calibration and pruned of the nodes whose ranges turn out unusable; when
nothing is left, ``nothing_to_quantize`` says why."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from enginefarm.errors import BuildFailed
from enginefarm.worker.onnxgraph import CONTROL_FLOW_OPS, DEFAULT_DOMAINS, all_nodes, constant_value

# The weighted operations TensorRT runs in int8 when their inputs come through Q/DQ.
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# The only operations a DequantizeLinear may feed in our output: the weighted ones, and residual Adds.
QUANTIZED_OPS = frozenset({*WEIGHTED_OPS, "Add"})


def _label(node: NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


@dataclass
class Weight:
    """A constant weight of a weighted node, stored int8 and dequantized (per channel along ``axis``)."""

    name: str
    axis: int | None  # None: one scale for the tensor


@dataclass
class Plan:
    """Which node inputs get Q/DQ: node index -> input slot -> the activation tensor's name (quantized per
    tensor through QuantizeLinear/DequantizeLinear) or a constant weight (stored int8, DequantizeLinear).
    Built before calibration, pruned once the ranges are known."""

    nodes: dict[int, dict[int, str | Weight]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def activations(self) -> set[str]:
        return {t for slots in self.nodes.values() for t in slots.values() if isinstance(t, str)}

    def drop(self, index: int, label: str, why: str | None) -> None:
        """Leave a node in float; ``why`` goes to the report (None: not worth reporting)."""
        self.nodes.pop(index, None)
        if why is not None:
            self.skipped[label] = why


def constants_to_initializers(model: ModelProto) -> None:
    """Turn Constant nodes that feed a weighted node into initializers, so their weights can be quantized."""
    graph = model.graph
    feeding = {name for n in graph.node if n.op_type in WEIGHTED_OPS for name in n.input}
    keep = []
    for node in graph.node:
        value = constant_value(node) if node.op_type == "Constant" else None
        if value is not None and node.output[0] in feeding:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
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


def plan_qdq(model: ModelProto, per_channel: bool) -> Plan:
    """Choose the Q/DQ inputs: activations and weights of weighted nodes, residual inputs of their Adds."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: i for i, n in enumerate(graph.node) for out in n.output}
    uses = Counter(name for n in all_nodes(graph) for name in n.input)
    uses.update(o.name for o in graph.output)

    def constant(name: str) -> bool:
        # An initializer also listed as a graph input (all of them before IR 4) is a weight to TensorRT too.
        return name in inits

    plan = Plan()
    for index, node in enumerate(graph.node):
        if node.op_type not in WEIGHTED_OPS or node.domain not in DEFAULT_DOMAINS or len(node.input) < 2:
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
        plan.nodes[index] = {act: node.input[act], slot: Weight(weight.name, axis)}

    convs = {i for i in plan.nodes if graph.node[i].op_type == "Conv"}
    for index, node in enumerate(graph.node):
        if node.op_type != "Add" or node.domain not in DEFAULT_DOMAINS or len(node.input) != 2:
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
        if node.op_type in CONTROL_FLOW_OPS:
            holder = onnx.GraphProto()
            holder.node.append(node)
            count = sum(1 for n in all_nodes(holder) if n.op_type in WEIGHTED_OPS)
            if count:
                found.append((_label(node, index), node.op_type, count))
    return found


def _unusable(tensor: str | Weight, amax: dict[str, float], inits: dict[str, TensorProto]) -> str | None:
    """Why an input cannot be quantized, or None."""
    if isinstance(tensor, Weight):
        finite = np.all(np.isfinite(numpy_helper.to_array(inits[tensor.name])))
        return None if finite else f"weight {tensor.name!r} holds NaN or infinity"
    if tensor not in amax:
        return f"input {tensor!r} has no FLOAT type known to shape inference, so no range"
    if not np.isfinite(amax[tensor]):
        return f"input {tensor!r} reached NaN or infinity on the calibration samples"
    if amax[tensor] == 0:
        return f"input {tensor!r} was all zeros on the calibration samples"
    return None


def prune(model: ModelProto, plan: Plan, amax: dict[str, float]) -> None:
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


def nothing_to_quantize(model: ModelProto, plan: Plan) -> BuildFailed:
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
