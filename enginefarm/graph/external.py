"""An ONNX model's tensors, and where the bytes of those kept outside the model file (external data) may live.

An external data entry is hostile input: its location may point anywhere on disk and its offset and length
anywhere in the file. ``check_external_data`` accepts only regular files inside the model's folder, reached
through no link, and ranges within them; every rejection raises ``ModelRejected`` naming the tensor.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from enginefarm.core.bundle import DRIVE
from enginefarm.core.errors import ModelRejected

_INT64_DIGITS = 19


# --------------------------------------------------------------------------- walking the graph


def _subgraphs(attr: AttributeProto) -> Iterator[GraphProto]:
    """Yield the graphs an attribute holds (If, Loop and Scan bodies)."""
    if attr.HasField("g"):
        yield attr.g
    yield from attr.graphs


def _attr_tensors(attr: AttributeProto) -> Iterator[TensorProto]:
    """Yield the tensors stored directly in an attribute, sparse ones included."""
    if attr.HasField("t"):
        yield attr.t
    yield from attr.tensors
    sparse = ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(attr.sparse_tensors)
    for s in sparse:
        yield s.values
        yield s.indices


def _nodes_deep(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Yield the nodes and, recursively, the nodes of their subgraphs."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                yield from _nodes_deep(sub.node)


def all_nodes(model: ModelProto) -> Iterator[onnx.NodeProto]:
    """Yield every node of the main graph, of the model's local functions, and of their subgraphs."""
    yield from _nodes_deep(model.graph.node)
    for fn in model.functions:
        yield from _nodes_deep(fn.node)


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Yield every tensor in the model: initializers of every (sub)graph and tensors in attributes."""
    graphs = [model.graph] + [sub for n in all_nodes(model) for a in n.attribute for sub in _subgraphs(a)]
    for graph in graphs:
        yield from graph.initializer
        for s in graph.sparse_initializer:
            yield s.values
            yield s.indices
    for node in all_nodes(model):
        for attr in node.attribute:
            yield from _attr_tensors(attr)


def _is_external(tensor: TensorProto) -> bool:
    # Entries without the EXTERNAL flag are ignored by readers, but checking them costs nothing.
    return tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data) > 0


# --------------------------------------------------------------------------- external data


def _external_number(tensor: TensorProto, key: str, value: str) -> int:
    """An external-data offset or length as ONNX Runtime reads it: plain ASCII digits. Python's int() also takes
    spaces, a sign, '_' and other scripts' digits, which would pass here and fail in every build."""
    where = f"external data offset/length for tensor {tensor.name!r}"
    if value.isascii() and value.isdigit():
        if len(value) > _INT64_DIGITS:  # also keeps int() clear of its limit on very long digit strings
            raise ModelRejected(f"{where} are over the int64 range ONNX Runtime reads: {key} has {len(value)} digits")
        return int(value)
    if value.startswith("-") and value[1:].isascii() and value[1:].isdigit() and int(value[1:]):
        raise ModelRejected(f"{where} are negative: {key} {value!r}; give a byte position within the data file")
    raise ModelRejected(
        f"{where} are not integers: {key} {value!r} must be plain ASCII digits, without sign, "
        "spaces or other characters"
    )


def _external_fields(tensor: TensorProto) -> tuple[str, int, int | None]:
    """Return the tensor's (location, offset, length); length is None when it runs to the file's end."""
    fields = {e.key: e.value for e in tensor.external_data}
    location = fields.get("location", "")
    offset = _external_number(tensor, "offset", fields["offset"]) if "offset" in fields else 0
    length = _external_number(tensor, "length", fields["length"]) if "length" in fields else None
    return location, offset, length


def _check_location(location: str, tensor: str) -> None:
    """Reject locations that are empty, absolute, or walk up out of the model's folder."""
    where = f"external data location {location!r} for tensor {tensor!r}"
    if not location or "\x00" in location:
        raise ModelRejected(f"{where} is empty or invalid")
    if location.startswith(("/", "\\")) or DRIVE.match(location) or os.path.isabs(location):
        raise ModelRejected(f"{where} is absolute; give a path relative to model.onnx")
    if "\\" in location:
        raise ModelRejected(f"{where} contains a backslash; use '/' to separate folders")
    if ".." in location.split("/"):
        raise ModelRejected(f"{where} contains '..'; data files must sit beside model.onnx or below it")


def _data_file(base: Path, location: str, tensor: str) -> Path:
    """Return the resolved data file for a checked location: inside base, no symlink, one link."""
    where = f"external data location {location!r} for tensor {tensor!r}"
    resolved = Path(os.path.realpath(base / location))
    root = Path(os.path.realpath(base))
    if resolved != root and root not in resolved.parents:
        raise ModelRejected(f"{where} resolves outside the bundle")
    # Every component is checked, not just the last: a linked folder would redirect the file.
    step = base
    for part in location.split("/"):
        step = step / part
        try:
            st = os.lstat(step)
        except OSError:
            raise ModelRejected(f"{where} names a file the bundle does not hold") from None
        if stat.S_ISLNK(st.st_mode):
            raise ModelRejected(f"{where} is a symlink or lies under one; data files must be regular files")
    if not stat.S_ISREG(st.st_mode):
        raise ModelRejected(f"{where} is not a regular file")
    # A hard link could alias a file outside the bundle; files we extracted have exactly one.
    if st.st_nlink != 1:
        raise ModelRejected(f"{where} is a hard link; data files must be plain files")
    return resolved


def check_external_data(model: ModelProto, base: Path) -> dict[Path, int]:
    """Validate every external tensor's location and range; return {data file: size}, each once."""
    files: dict[Path, int] = {}
    for tensor in _all_tensors(model):
        if not _is_external(tensor):
            continue
        location, offset, length = _external_fields(tensor)
        _check_location(location, tensor.name)
        data = _data_file(base, location, tensor.name)
        size = files.setdefault(data, data.stat().st_size)
        end = offset + (length or 0)
        if end > size:
            raise ModelRejected(
                f"external data for tensor {tensor.name!r} spans bytes {offset}..{end} "
                f"but {location!r} holds only {size} bytes"
            )
    return files


def uses_external_data(model: ModelProto) -> bool:
    return any(_is_external(t) for t in _all_tensors(model))
