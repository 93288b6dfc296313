"""The bodies of control-flow nodes (If/Loop/Scan) in the fp16 conversion: weights that only a body reads
move into it, and each body is converted as a graph of its own with float32 at its boundary, or left
float32 whole when that fails."""

from __future__ import annotations

import onnx
from onnx import GraphProto, NodeProto, TensorProto, helper

from worker.rewrite.fp16.convert import Options, convert_graph
from worker.rewrite.fp16.report import Tally
from worker.rewrite.fp16.weights import FLOAT, convert_initializers_in_memory
from worker.rewrite.onnxgraph import CONTROL_FLOW_OPS, free_names, rename_in_graph, rename_tensors, subgraphs


def move_weights_into_bodies(graph: GraphProto) -> None:
    """Float initializers that only control-flow bodies read become initializers of those bodies, so
    a body converts them to fp16 itself rather than casting float32 weights each time it runs."""
    explicit = {x for n in graph.node for x in n.input} | {o.name for o in graph.output}
    weights = {t.name: t for t in graph.initializer if t.data_type == FLOAT and t.name not in explicit}
    moved: set[str] = set()
    for node in graph.node:
        if node.op_type not in CONTROL_FLOW_OPS:
            continue
        for attr, sub in subgraphs(node):
            mapping = {}
            for name in sorted(n for n in free_names(sub) if n in weights):
                copy = TensorProto()
                copy.CopyFrom(weights[name])
                copy.name = mapping[name] = f"{node.name}.{attr}/{name}"
                sub.initializer.append(copy)
            rename_in_graph(sub, mapping)
            moved.update(mapping)
    for tensor in [t for t in graph.initializer if t.name in moved]:
        graph.initializer.remove(tensor)


def convert_bodies(graph: GraphProto, all_types: dict[str, int], opts: Options, tally: Tally) -> None:
    """Convert the bodies of the control-flow nodes in ``graph``, innermost first, in place."""
    for node in graph.node:
        if node.op_type not in CONTROL_FLOW_OPS:
            continue
        for attr, sub in subgraphs(node):
            convert_bodies(sub, all_types, opts, tally)
            _convert_body(node, attr, sub, all_types, opts, tally)


def _convert_body(
    owner: NodeProto, attr_name: str, sub: GraphProto, all_types: dict[str, int], opts: Options, tally: Tally
) -> None:
    """Convert one subgraph as a model of its own whose inputs are its formal inputs and the outer
    tensors it reads, all float32 at the boundary. Left as it is (float32) when that fails."""
    where = f"{owner.name}.{attr_name}"
    free = free_names(sub)
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
    old_tensors = (
        {x for n in graph.node for x in n.output} | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    )
    old_nodes = {n.name for n in graph.node}
    local = Tally()
    try:
        model = onnx.shape_inference.infer_shapes(model)
        model = convert_graph(
            model,
            opts,
            local,
            keep_io_types=True,
            write=lambda m, names: convert_initializers_in_memory(m, names, opts.reader),
        )
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
    rename_tensors(graph, rename)
