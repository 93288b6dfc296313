"""Converting one graph to mixed fp16/fp32: ONNX Runtime's float16 converter run with our block list, then
the clean-up after it (float32 round trips folded away, renamed outputs given their names back, nodes
sorted) and the check of the written model."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import GraphProto, ModelProto

from enginefarm.core.errors import BuildFailed
from worker.rewrite.fp16.keep_fp32 import SHAPE_READERS, classify, float_only_inputs, is_float_node
from worker.rewrite.fp16.prepare import cast_outer_scope_inputs, fp16_initializers, split_shared_constants
from worker.rewrite.fp16.report import Tally
from worker.rewrite.fp16.weights import FLOAT, FLOAT16, FP16_MAX, TensorReader
from worker.rewrite.onnxgraph import (
    CONTROL_FLOW_OPS,
    cast_to,
    default_opset,
    outer_refs,
    reads,
    rename_in_subgraphs,
    rename_tensors,
    tensor_types,
    topological_order,
)


@dataclass
class Options:
    """What the caller asked for, and what every graph of the model converts with."""

    keep_ops: set[str]
    keep_nodes: set[str]
    sensitive_ops: set[str]
    reader: TensorReader
    opset_import: list[Any]
    ir_version: int


def convert_graph(model: ModelProto, opts: Options, tally: Tally, *, keep_io_types: bool, write: Any) -> ModelProto:
    """Convert the main graph of a shape-inferred ``model``; its control-flow nodes keep float32 boundaries.

    ``write(model, names)`` turns the named initializers into fp16 (and stores them) before the
    library rewrites the graph; it returns the numbers of float initializers made fp16 and kept.
    """
    opset = default_opset(model, missing=1)
    types = tensor_types(model.graph)
    reasons = classify(
        model,
        types,
        keep_ops=opts.keep_ops,
        keep_nodes=opts.keep_nodes,
        sensitive_ops=opts.sensitive_ops,
        reader=opts.reader,
    )
    source = [(n.name, n.op_type, is_float_node(n, types)) for n in model.graph.node]
    blocked = set(reasons)
    split_shared_constants(model, blocked, types)
    cast_outer_scope_inputs(model, blocked, types)
    n_fp16, n_fp32 = write(model, fp16_initializers(model, blocked))
    tally.initializers_fp16 += n_fp16
    tally.initializers_fp32 += n_fp32

    before = {n.name: list(n.output) for n in model.graph.node}
    model, tally.library = _run_converter(model, blocked, keep_io_types)
    added = {n.name for n in model.graph.node if n.name not in before}
    fold_round_trips(model, added, opset)
    _restore_names(model.graph, added, before)
    _topological_sort(model.graph)
    del model.graph.value_info[:]
    casts = sum(1 for n in model.graph.node if n.name in added or n.name.endswith("__fp32_outer"))
    tally.add(source, reasons, casts)
    return model


def _run_converter(model: ModelProto, blocked: set[str], keep_io_types: bool) -> tuple[ModelProto, str]:
    """ONNX Runtime's converter with our block list (and none of its default op block list)."""
    import onnxruntime
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(
        model,
        keep_io_types=keep_io_types,
        disable_shape_infer=True,
        op_block_list=[],
        node_block_list=sorted(blocked),
        max_finite_val=FP16_MAX,
    )
    return model, f"onnxruntime.transformers.float16 (onnxruntime {onnxruntime.__version__})"


def fold_round_trips(model: ModelProto, added: set[str], opset: int) -> None:
    """Undo the float32 -> fp16 -> float32 round trips the converter leaves between float32 nodes.

    The converter casts every float32 output of a kept node to fp16 and every fp16 input of a kept
    node back to float32, also when both ends are float32. Read the float32 value directly instead,
    then drop the casts that no longer do anything.
    """
    graph = model.graph
    _one_cast_per_name(graph, added)
    types = tensor_types(onnx.shape_inference.infer_shapes(model).graph)
    producers = {out: n for n in graph.node for out in n.output}
    graph_outputs = {o.name for o in graph.output}

    def fp32_source(name: str) -> str | None:
        inner = producers.get(name)
        if (
            inner is not None
            and inner.name in added
            and inner.op_type == "Cast"
            and cast_to(inner) == FLOAT16
            and types.get(inner.input[0]) == FLOAT
        ):
            return inner.input[0]
        return None

    for node in graph.node:
        if node.op_type == "Cast" and cast_to(node) == FLOAT:
            node.input[0] = fp32_source(node.input[0]) or node.input[0]
        # Inputs that only take float32 (Resize scales) read a float32 source directly.
        for i in float_only_inputs(node.op_type, opset):
            if i < len(node.input) and node.input[i]:
                node.input[i] = fp32_source(node.input[i]) or node.input[i]
        # Shape and Size read dimensions only: no cast in front of them.
        if node.op_type in SHAPE_READERS and node.input:
            cast = producers.get(node.input[0])
            if cast is not None and cast.name in added and cast.op_type == "Cast":
                node.input[0] = cast.input[0]
    # Added casts to float32 of what is float32 already: readers take the input directly.
    alias: dict[str, str] = {}
    for node in graph.node:
        if (
            node.name in added
            and node.op_type == "Cast"
            and cast_to(node) == FLOAT
            and types.get(node.input[0]) == FLOAT
            and node.output[0] not in graph_outputs
        ):
            alias[node.output[0]] = node.input[0]
    if alias:
        for node in graph.node:
            for i, name in enumerate(node.input):
                while name in alias:
                    name = alias[name]
                node.input[i] = name
    # Identical added casts of one tensor (a kept reader and a graph output both wanting float32): one is enough.
    canonical: dict[tuple[str, int | None], str] = {}
    for node in sorted(
        (n for n in graph.node if n.name in added and n.op_type == "Cast"),
        key=lambda n: n.output[0] not in graph_outputs,
    ):
        canonical.setdefault((node.input[0], cast_to(node)), node.output[0])
    same = {
        n.output[0]: canonical[(n.input[0], cast_to(n))]
        for n in graph.node
        if n.name in added
        and n.op_type == "Cast"
        and n.output[0] not in graph_outputs
        and canonical[(n.input[0], cast_to(n))] != n.output[0]
    }
    if same:
        for node in graph.node:
            for i, name in enumerate(node.input):
                node.input[i] = same.get(name, name)
            if node.op_type in CONTROL_FLOW_OPS:
                rename_in_subgraphs(node, same)
    # Outer-scope casts of what stayed float32: subgraphs read the tensor itself again.
    for node in list(graph.node):
        if node.name.endswith("__fp32_outer") and types.get(node.input[0]) == FLOAT:
            for reader in graph.node:
                if reader.op_type in CONTROL_FLOW_OPS and node.output[0] in outer_refs(reader):
                    rename_in_subgraphs(reader, {node.output[0]: node.input[0]})
            graph.node.remove(node)
    # A float32 -> float32 cast in front of a graph output: the producer writes the output itself.
    _drop_unread_casts(graph, added)
    readers = Counter(x for n in graph.node for x in n.input)
    implicit = set().union(*(outer_refs(n) for n in graph.node if n.op_type in CONTROL_FLOW_OPS))
    producers = {out: n for n in graph.node for out in n.output}
    for node in list(graph.node):
        src = node.input[0] if node.input else ""
        if (
            node.name in added
            and node.op_type == "Cast"
            and cast_to(node) == FLOAT
            and types.get(src) == FLOAT
            and node.output[0] in graph_outputs
            and src in producers
            and src not in graph_outputs
            and readers[src] == 1
            and src not in implicit
        ):
            producer = producers[src]
            producer.output[list(producer.output).index(src)] = node.output[0]
            graph.node.remove(node)
    _drop_unread_casts(graph, added)


def _restore_names(graph: GraphProto, added: set[str], before: dict[str, list[str]]) -> None:
    """Give outputs the converter renamed (``x`` -> ``x_cast_to_fp16``, ``node_output_cast_0``...)
    their names back where the fp16 copy that took the name is gone, so logs and errors name the
    model's own tensors."""
    names = {x for n in graph.node for x in [*reads(n), *n.output]} | {o.name for o in graph.output}
    rename: dict[str, str] = {}
    for node in graph.node:
        original = before.get(node.name)
        if node.name in added or original is None or len(original) != len(node.output):
            continue
        for now, was in zip(node.output, original, strict=True):
            if now != was and was and was not in names and was not in rename.values():
                rename[now] = was
    if rename:
        rename_tensors(graph, rename)


def _one_cast_per_name(graph: GraphProto, added: set[str]) -> None:
    """Drop an added cast that writes the same tensor as an earlier one from the same source to the same type: a
    converter that names a cast after its tensor once per input slot writes two for ``Concat [x, x]``."""
    seen: dict[str, tuple[str, int | None]] = {}
    for node in list(graph.node):
        if node.name not in added or node.op_type != "Cast" or not node.input:
            continue
        key = (node.input[0], cast_to(node))
        if seen.get(node.output[0]) == key:
            graph.node.remove(node)
        else:
            seen.setdefault(node.output[0], key)


def _drop_unread_casts(graph: GraphProto, added: set[str]) -> None:
    """Remove added casts nobody reads (explicitly, or from inside a subgraph)."""
    graph_outputs = {o.name for o in graph.output}
    while True:
        used = {x for n in graph.node for x in reads(n)} | graph_outputs
        dead = [n for n in graph.node if n.name in added and n.op_type == "Cast" and n.output[0] not in used]
        if not dead:
            return
        for n in dead:
            graph.node.remove(n)


def _topological_sort(graph: GraphProto) -> None:
    """Order nodes so every input is produced before it is read, keeping the given order where possible."""
    nodes = list(graph.node)
    ordered = topological_order(graph)
    if len(ordered) != len(nodes):
        raise BuildFailed("fp16 conversion produced a graph with a cycle or a dangling input")
    del graph.node[:]
    graph.node.extend(ordered)


def check(path: Path) -> None:
    """The saved model must pass the checker and strict, type-checking shape inference."""
    try:
        onnx.checker.check_model(str(path))
        onnx.shape_inference.infer_shapes(
            onnx.load(str(path), load_external_data=False), strict_mode=True, check_type=True
        )
    except Exception as exc:
        raise BuildFailed(f"the fp16 conversion produced an invalid model: {str(exc).strip()[:2000]}") from exc
