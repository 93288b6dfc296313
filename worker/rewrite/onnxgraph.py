"""Walking and rewriting ONNX graphs, control-flow bodies included: the graph helpers the worker's model
rewrites share (fp16 conversion, int8 quantization).

Subgraphs (If branches, Loop and Scan bodies) read tensors of enclosing graphs by name, without listing
them as inputs of their node; ``outer_refs`` names those reads, and ``consumers``, ``topological_order``
and the renaming helpers take them into account.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

from enginefarm.core.errors import SpecInvalid

# The names of the default ONNX domain.
DEFAULT_DOMAINS = ("", "ai.onnx")
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def default_opset(model: ModelProto, *, missing: int) -> int:
    """The model's opset of the default domain; ``missing`` when it imports none."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return imp.version
    return missing


# --------------------------------------------------------------------------- nested graphs


def subgraphs(node: NodeProto) -> Iterator[tuple[str, GraphProto]]:
    """(attribute name, graph) for each graph the node's attributes hold (If branches, Loop and Scan bodies)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from ((attr.name, g) for g in attr.graphs)


def all_graphs(graph: GraphProto) -> Iterator[GraphProto]:
    """``graph`` and every graph nested in it, outermost first."""
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from all_graphs(sub)


def all_nodes(graph: GraphProto) -> Iterator[NodeProto]:
    """Every node of the graph and of the subgraphs inside it, each node followed by its subgraphs' nodes."""
    for node in graph.node:
        yield node
        for _, sub in subgraphs(node):
            yield from all_nodes(sub)


def attribute_tensors(node: NodeProto) -> Iterator[TensorProto]:
    """The tensors stored in the node's attributes (a Constant's value, for one)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.TENSOR:
            yield attr.t
        elif attr.type == AttributeProto.TENSORS:
            yield from attr.tensors


def all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """The initializers of every graph and the tensors stored in node attributes."""
    for g in all_graphs(model.graph):
        yield from g.initializer
        for node in g.node:
            yield from attribute_tensors(node)


def check_kept_layers(graph: GraphProto, names: Iterable[str]) -> None:
    """Raise SpecInvalid for the node names in ``names`` (a spec's ``keep_fp32_layers``) the graph does not have."""
    missing = set(names) - {n.name for n in all_nodes(graph)}
    if missing:
        raise SpecInvalid(
            f"keep_fp32_layers names nodes the model does not have: {sorted(missing)}; node names "
            "are the ONNX graph's (Netron or onnx.load show them)",
            problems=[
                {"loc": ["spec", "keep_fp32_layers", name], "msg": f"no node named {name!r}"}
                for name in sorted(missing)
            ],
        )


# --------------------------------------------------------------------------- outer-scope reads


def free_names(graph: GraphProto) -> set[str]:
    """Names ``graph`` (or a graph nested in it) reads without defining them: tensors of enclosing scopes."""
    defined = (
        {i.name for i in graph.input}
        | {t.name for t in graph.initializer}
        | {t.values.name for t in graph.sparse_initializer}
    )
    used: set[str] = {o.name for o in graph.output}
    for node in graph.node:
        used.update(x for x in node.input if x)
        for _, g in subgraphs(node):
            used |= free_names(g)
        defined.update(node.output)
    return used - defined


def outer_refs(node: NodeProto) -> set[str]:
    """Names a node's subgraphs read from enclosing scopes."""
    return set().union(*(free_names(g) for _, g in subgraphs(node)))


def reads(node: NodeProto) -> set[str]:
    """The tensors a node reads: its inputs and, for control flow, what its subgraphs read from enclosing scopes."""
    names = {x for x in node.input if x}
    return names | outer_refs(node) if node.op_type in CONTROL_FLOW_OPS else names


def rename_in_subgraphs(node: NodeProto, mapping: dict[str, str]) -> None:
    """Make the subgraphs of ``node`` read outer tensors under new names (old name -> new name)."""
    for _, g in subgraphs(node):
        rename_in_graph(g, mapping)


def rename_in_graph(graph: GraphProto, mapping: dict[str, str]) -> None:
    """Make ``graph`` and the graphs nested in it read tensors under new names."""
    if not mapping:
        return
    for sub in all_graphs(graph):
        for n in sub.node:
            for i, x in enumerate(n.input):
                if x in mapping:
                    n.input[i] = mapping[x]
        for out in sub.output:
            if out.name in mapping:
                # A graph output that is the renamed tensor itself: route it through an Identity.
                old = out.name
                ident = helper.make_node(
                    "Identity", [mapping[old]], [f"{old}__{sub.name}_out"], name=f"{old}__{sub.name}_out"
                )
                sub.node.append(ident)
                out.name = ident.output[0]


def rename_tensors(graph: GraphProto, mapping: dict[str, str]) -> None:
    """Rename tensors wherever the nodes of ``graph`` read or write them, outer reads of their subgraphs included."""
    for node in graph.node:
        for i, x in enumerate(node.input):
            node.input[i] = mapping.get(x, x)
        for i, x in enumerate(node.output):
            node.output[i] = mapping.get(x, x)
        if node.op_type in CONTROL_FLOW_OPS:
            rename_in_subgraphs(node, mapping)


def consumers(graph: GraphProto, *, deep: bool = False) -> dict[str, list[tuple[NodeProto, int]]]:
    """Tensor name -> (reading node, input position).

    The nodes of ``graph`` itself, a control-flow node at position -1 for each tensor its subgraphs read
    from here; with ``deep``, the nodes of every nested graph as well, each at its own input positions.
    """
    out: dict[str, list[tuple[NodeProto, int]]] = defaultdict(list)
    for node in all_nodes(graph) if deep else graph.node:
        for i, name in enumerate(node.input):
            if name:
                out[name].append((node, i))
        if not deep and node.op_type in CONTROL_FLOW_OPS:
            for name in outer_refs(node):
                out[name].append((node, -1))
    return out


def topological_order(graph: GraphProto) -> list[NodeProto]:
    """The nodes ordered so every input, outer-scope reads included, is produced before it is read, keeping
    the given order where possible. Nodes on a cycle or behind one are left out."""
    nodes = list(graph.node)
    producer_index = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    deps: list[set[int]] = []
    for n in nodes:
        deps.append({producer_index[x] for x in reads(n) if x in producer_index})
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


# --------------------------------------------------------------------------- constants and types


def constant_value(node: NodeProto) -> TensorProto | None:
    """The tensor of a Constant node given as ``value``."""
    for attr in node.attribute:
        if attr.name == "value" and attr.type == AttributeProto.TENSOR:
            return attr.t
    return None


def constant_tensors(graph: GraphProto) -> dict[str, TensorProto | NodeProto]:
    """Tensor name -> the initializer or Constant node that holds it."""
    const: dict[str, TensorProto | NodeProto] = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            const[node.output[0]] = node
    return const


def tensor_types(graph: GraphProto) -> dict[str, int]:
    """Tensor name -> ONNX element type, as far as the graph's value infos, initializers and constants say."""
    types: dict[str, int] = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    for node in graph.node:
        if node.op_type == "Constant":
            value = constant_value(node)
            if value is not None:
                types[node.output[0]] = value.data_type
    return types


def cast_to(node: NodeProto) -> int | None:
    """The element type a Cast node converts to."""
    for attr in node.attribute:
        if attr.name == "to":
            return attr.i
    return None


# --------------------------------------------------------------------------- files


# A protobuf message cannot exceed 2 GiB: past this, weights go to an external data file beside the graph.
INLINE_LIMIT = (1 << 31) - (64 << 20)


def save_model(model: ModelProto, path: Path, *, external: bool, location: str | None = None) -> None:
    """Write ``model`` to ``path``, creating its folder. With ``external``, tensors of 1 KiB and more go to one
    data file beside it, ``location`` (``<file name>.data`` unless given), which is written anew: onnx would
    append to a file already there."""
    location = location or f"{path.name}.data"
    if external:
        path.with_name(location).unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=1024,
    )
