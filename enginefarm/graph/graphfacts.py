"""Facts read off an ONNX graph at upload that later stages need without reparsing it: how many nodes of each op
type it has (validation knows what a backend cannot build), and which integer inputs index a table (benchmark
and accuracy inputs must stay within it, or an embedding lookup reads out of range)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from onnx import GraphProto, NodeProto, TensorProto

# The ops of explicit quantization: a model holding them is built int8 as it is, never folded or re-quantized.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# Ops an index passes through unchanged in value on its way to a Gather.
_VALUE_PRESERVING = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand", "Transpose"})
_INTEGER_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


def op_counts(nodes: Iterable[NodeProto]) -> dict[str, int]:
    """Op type -> node count; custom domains are written ``domain::Op``."""
    counts = Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in nodes)
    return dict(sorted(counts.items()))


def _table_rows(graph: GraphProto) -> dict[str, list[int]]:
    """Dims of every tensor whose shape is known without running the graph: initializers and Constant outputs."""
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.type == attr.TENSOR:
                    dims[node.output[0]] = list(attr.t.dims)
    return dims


def index_ranges(graph: GraphProto) -> dict[str, list[int]]:
    """Integer graph inputs that reach the indices of a Gather on a known table, through value-preserving ops:
    input name -> [0, rows - 1] of the smallest such table."""
    consumers: dict[str, list[tuple[NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))
    tables = _table_rows(graph)
    weights = {t.name for t in graph.initializer}
    out: dict[str, list[int]] = {}
    for value in graph.input:
        if value.name in weights or value.type.WhichOneof("value") != "tensor_type":
            continue
        if value.type.tensor_type.elem_type not in _INTEGER_TYPES:
            continue
        rows = _rows_reached(value.name, consumers, tables)
        if rows:
            out[value.name] = [0, min(rows) - 1]
    return out


def _rows_reached(
    start: str, consumers: dict[str, list[tuple[NodeProto, int]]], tables: dict[str, list[int]]
) -> list[int]:
    rows, todo, seen = [], [start], {start}
    while todo:
        name = todo.pop()
        for node, slot in consumers.get(name, []):
            if node.op_type == "Gather" and slot == 1:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                table = tables.get(node.input[0])
                if table and -len(table) <= axis < len(table) and table[axis] > 0:
                    rows.append(table[axis])
            elif node.op_type in _VALUE_PRESERVING and slot == 0:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        todo.append(out)
    return rows
