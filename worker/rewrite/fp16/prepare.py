"""Rewrites of a graph before ONNX Runtime's float16 converter runs on it: unique node names and explicit
float constants, float32 copies of constants that fp16 and float32 nodes share, explicit casts for the
outer tensors that kept control-flow bodies read, and which initializers become fp16."""

from __future__ import annotations

from onnx import ModelProto, NodeProto, TensorProto, helper

from worker.rewrite.fp16.keep_fp32 import float_only_inputs
from worker.rewrite.fp16.weights import FLOAT
from worker.rewrite.onnxgraph import (
    CONTROL_FLOW_OPS,
    all_graphs,
    consumers,
    default_opset,
    outer_refs,
    rename_in_subgraphs,
)


def prepare(model: ModelProto, notes: list[str]) -> None:
    """Unique node names, initializers off the graph inputs, explicit float constants as tensors."""
    seen: set[str] = set()
    for graph in all_graphs(model.graph):
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
                        node.attribute.append(
                            helper.make_attribute("value", helper.make_tensor(node.output[0], FLOAT, dims, values))
                        )
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


def split_shared_constants(model: ModelProto, blocked: set[str], types: dict[str, int]) -> None:
    """Give float32 readers of a float constant that fp16 nodes also read their own float32 copy."""
    graph = model.graph
    users = consumers(graph)
    inits = {t.name: t for t in graph.initializer}
    const_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    opset = default_opset(model, missing=1)
    for name in list(inits) + list(const_nodes):
        if types.get(name) != FLOAT:
            continue
        uses = users.get(name, [])
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
                rename_in_subgraphs(consumer, {name: copy_name})
        types[copy_name] = FLOAT


def _reads_fp32(node: NodeProto, idx: int, blocked: set[str], opset: int) -> bool:
    return node.name in blocked or idx in float_only_inputs(node.op_type, opset)


def cast_outer_scope_inputs(model: ModelProto, blocked: set[str], types: dict[str, int]) -> None:
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
        if node.op_type not in CONTROL_FLOW_OPS or node.name not in blocked:
            continue
        for name in sorted(outer_refs(node)):
            if types.get(name) != FLOAT or name in inits:
                continue  # float initializers read by kept nodes stay float32 (split when shared)
            cast_out = f"{name}__fp32_outer"
            if cast_out not in producers:
                cast = helper.make_node("Cast", [name], [cast_out], to=FLOAT, name=f"{name}__fp32_outer")
                graph.node.insert(list(graph.node).index(node), cast)
                blocked.add(cast.name)
                producers[cast_out] = cast
                types[cast_out] = FLOAT
            rename_in_subgraphs(node, {name: cast_out})


def fp16_initializers(model: ModelProto, blocked: set[str]) -> set[str]:
    """Main-graph float initializers that only fp16 nodes read (after split_shared_constants)."""
    graph = model.graph
    opset = default_opset(model, missing=1)
    users = consumers(graph)
    out = set()
    for init in graph.initializer:
        if init.data_type != FLOAT:
            continue
        uses = users.get(init.name, [])
        if uses and not any(_reads_fp32(c, i, blocked, opset) for c, i in uses):
            out.add(init.name)
    return out
