"""Uploaded model files: inspect the ONNX model of a plain file or a bundle (``enginefarm.bundle`` unpacks those).

An upload is either a single ``.onnx`` file or a ``.zip``/``.tar`` bundle holding ``model.onnx``
and its external data files. Everything here treats the bytes as hostile: archives may try to
escape their folder or expand without bound, and an ONNX model's external data entries may point
anywhere on disk. Every rejection raises ``ModelRejected`` (``PayloadTooLarge`` for size limits)
with a message the uploader can act on.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

from enginefarm.bundle import DRIVE, FORMATS, MODEL_NAME, BundleLimits, detect_format, unpack_bundle
from enginefarm.domain import ModelInfo, TensorInfo
from enginefarm.graph.graphfacts import QDQ_OPS, index_ranges, op_counts
from enginefarm.errors import ModelRejected

# No builder takes a dimension this large; a model declaring one is broken or hostile.
_MAX_DECLARED_DIM = (1 << 31) - 1
# Graph input and output names (and dim names) are stored with the model, shown in every listing and build log,
# and written into Triton configurations; real exporters stay far below this.
MAX_TENSOR_NAME_BYTES = 1024
_NAME_SHOWN = 40
_INT64_DIGITS = 19
_DEFAULT_DOMAINS = ("", "ai.onnx")

@dataclass
class InspectedModel:
    """An accepted upload: its format, the ``.onnx`` file to build from, and what it holds."""

    format: str
    model_path: Path
    info: ModelInfo


# --------------------------------------------------------------------------- parsing


def _read_varint(f: BinaryIO) -> int | None:
    """Return the next protobuf varint, or None at end of file."""
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _model_wire_types() -> dict[int, int]:
    """Map each ModelProto field number to its protobuf wire type (0 varint, 2 length-delimited)."""
    delimited = {FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES}
    return {f.number: 2 if f.type in delimited else 0 for f in ModelProto.DESCRIPTOR.fields}


_MODEL_WIRE = _model_wire_types()


def _cut_short(path: Path) -> str | None:
    """Return where a ModelProto-shaped file stops mid-field, or None if it is not one cut short.

    Walks the top-level fields only; a field ModelProto does not have means the bytes were never
    ONNX, so text and random bytes are not mistaken for a truncated upload.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            while (tag := _read_varint(f)) is not None:
                if _MODEL_WIRE.get(tag >> 3) != tag & 7:
                    return None
                if tag & 7 == 0:
                    if _read_varint(f) is None:
                        return f"the file ends inside field {tag >> 3} at byte {size}"
                    continue
                length = _read_varint(f)
                if length is None or f.tell() + length > size:
                    return f"field {tag >> 3} runs past the end of the file at byte {size}"
                f.seek(length, os.SEEK_CUR)
        except ValueError:
            return None
    return None


def _load(path: Path) -> ModelProto:
    """Parse the ModelProto without external data; raise ModelRejected for anything unusable."""
    try:
        # format="protobuf": onnx.load otherwise picks a text parser for names like *.txt or *.json.
        model = onnx.load(str(path), format="protobuf", load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as exc:
        if path.stat().st_size and (where := _cut_short(path)):
            raise ModelRejected(f"truncated ONNX file: {where}; upload the whole file") from None
        raise ModelRejected(f"not an ONNX model: the bytes do not parse as an ONNX ModelProto ({exc})") from None
    _check_structure(model)
    return model


def _check_structure(model: ModelProto) -> None:
    """Reject protos that parsed but are no usable model (random bytes can decode as a ModelProto)."""
    if not model.ir_version:
        raise ModelRejected("not an ONNX model: it has no ir_version (is the file empty or not ONNX?)")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelRejected(
            f"model ir_version {model.ir_version} is newer than this server reads (up to {onnx.IR_VERSION}); "
            "export with an older IR version"
        )
    if not model.HasField("graph"):
        raise ModelRejected("not an ONNX model: it has no graph")
    if not model.graph.node or not model.graph.output:
        raise ModelRejected("ONNX model graph has no nodes or no outputs; there is nothing to build")


def _check(model_path: Path) -> None:
    """Run onnx.checker on the file (the path form works for models over 2 GB)."""
    try:
        onnx.checker.check_model(str(model_path))
    except onnx.checker.ValidationError as exc:
        raise ModelRejected(f"model fails onnx.checker: {exc}") from None


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


def _all_nodes(model: ModelProto) -> Iterator[onnx.NodeProto]:
    """Yield every node of the main graph, of the model's local functions, and of their subgraphs."""
    yield from _nodes_deep(model.graph.node)
    for fn in model.functions:
        yield from _nodes_deep(fn.node)


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Yield every tensor in the model: initializers of every (sub)graph and tensors in attributes."""
    graphs = [model.graph] + [sub for n in _all_nodes(model) for a in n.attribute for sub in _subgraphs(a)]
    for graph in graphs:
        yield from graph.initializer
        for s in graph.sparse_initializer:
            yield s.values
            yield s.indices
    for node in _all_nodes(model):
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
    raise ModelRejected(f"{where} are not integers: {key} {value!r} must be plain ASCII digits, without sign, "
                        "spaces or other characters")


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


def _check_external_data(model: ModelProto, base: Path) -> dict[Path, int]:
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


def _uses_external_data(model: ModelProto) -> bool:
    return any(_is_external(t) for t in _all_tensors(model))


# --------------------------------------------------------------------------- metadata


def _text(value: str | bytes, what: str) -> str:
    """A string field of the proto; protobuf hands back bytes where the field is not valid UTF-8."""
    if isinstance(value, bytes):
        raise ModelRejected(f"{what} {value!r} is not valid UTF-8 text")
    return value


def _short(name: str) -> str:
    return repr(name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "...")


def _check_io(kind: str, values: Iterable[onnx.ValueInfoProto]) -> None:
    """Reject graph input or output names (and their dim names) over MAX_TENSOR_NAME_BYTES, and negative dims:
    ONNX dims are sizes, 0 or more; dynamic ones have a name or no value."""
    for value in values:
        name = _text(value.name, "tensor name")
        if len(name.encode()) > MAX_TENSOR_NAME_BYTES:
            raise ModelRejected(f"{kind} {_short(name)} has a name of {len(name.encode())} bytes, which is longer than "
                                f"{MAX_TENSOR_NAME_BYTES} bytes; rename it")
        kind_of = value.type.WhichOneof("value")
        if kind_of not in ("tensor_type", "sparse_tensor_type"):
            continue
        for axis, d in enumerate(getattr(value.type, kind_of).shape.dim):
            which = d.WhichOneof("value")
            # -1 is how several exporters (paddle2onnx among them) mark a dynamic dim, and runtimes read it so.
            if which == "dim_value" and d.dim_value < -1:
                raise ModelRejected(f"{kind} {_short(name)} declares dim {d.dim_value} at axis {axis}; a dim is a size, "
                                    "0 or more, or -1, a name or nothing for a dynamic one")
            param = _text(d.dim_param, f"dim name of {_short(name)}") if which == "dim_param" else ""
            if len(param.encode()) > MAX_TENSOR_NAME_BYTES:
                raise ModelRejected(f"the dim name at axis {axis} of {kind} {_short(name)} is longer than "
                                    f"{MAX_TENSOR_NAME_BYTES} bytes; use a short name such as 'batch'")


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    """Describe a graph input or output; non-tensor types (sequences, maps) get their kind as dtype."""
    name = _text(value.name, "tensor name")
    kind = value.type.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return TensorInfo(name, (kind or "undefined").removesuffix("_type").upper(), [])
    ttype = getattr(value.type, kind)
    dims: list[int | str | None] = []
    for d in ttype.shape.dim:
        which = d.WhichOneof("value")
        param = _text(d.dim_param, f"dim name of {name!r}") if which == "dim_param" else None
        dims.append(d.dim_value if which == "dim_value" else param)
    return TensorInfo(name, TensorProto.DataType.Name(ttype.elem_type), dims)


def _check_inputs(inputs: list[onnx.ValueInfoProto]) -> None:
    """Reject graph inputs no engine can be fed: non-tensor types, no element type, absurd dims."""
    for value in inputs:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            what = (kind or "undefined").removesuffix("_type")
            raise ModelRejected(f"input {value.name!r} is of type {what}, not a tensor; engines take tensor inputs only")
        ttype = value.type.tensor_type
        if ttype.elem_type == TensorProto.UNDEFINED:
            raise ModelRejected(f"input {value.name!r} has no element type (UNDEFINED)")
        for axis, d in enumerate(ttype.shape.dim):
            if d.WhichOneof("value") == "dim_value" and d.dim_value > _MAX_DECLARED_DIM:
                raise ModelRejected(f"input {value.name!r} declares dim {d.dim_value} at axis {axis}, "
                                    f"over the largest buildable dim {_MAX_DECLARED_DIM}")


def _default_opset(model: ModelProto) -> int:
    """Return the default-domain opset version the model imports."""
    for op in model.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return op.version
    raise ModelRejected("model imports no opset for the default ONNX domain")


def _model_info(model: ModelProto, model_path: Path, data_files: dict[Path, int]) -> ModelInfo:
    """Collect the metadata of an accepted model."""
    graph = model.graph
    weights = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    _check_io("input", inputs)
    _check_io("output", graph.output)
    _check_inputs(inputs)
    return ModelInfo(
        inputs=[_tensor_info(v) for v in inputs],
        outputs=[_tensor_info(v) for v in graph.output],
        opset=_default_opset(model),
        ir_version=model.ir_version,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        size=model_path.stat().st_size + sum(data_files.values()),
        has_qdq=any(n.op_type in QDQ_OPS for n in _all_nodes(model)),
        external_data=_uses_external_data(model),
        op_types=op_counts(_all_nodes(model)),
        index_ranges=index_ranges(model.graph),
    )


# --------------------------------------------------------------------------- entry points


def _unpack_fresh(path: Path, fmt: str, workdir: Path, limits: BundleLimits) -> Path:
    """Unpack a bundle into a new folder under workdir; return its model.onnx path."""
    workdir.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="bundle-", dir=workdir))
    try:
        return unpack_bundle(path, fmt, dest, limits)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _load_checked(model_path: Path, fmt: str) -> tuple[ModelProto, dict[Path, int]]:
    """Parse the model and vet its external data; return the proto and its data files."""
    model = _load(model_path)
    if fmt == "onnx" and _uses_external_data(model):
        raise ModelRejected(
            "this model keeps tensors in external files; upload a .zip or .tar bundle "
            "with model.onnx and its data files"
        )
    return model, _check_external_data(model, model_path.parent)


def _check_one_model(model_path: Path) -> None:
    """Reject a bundle holding other .onnx files besides model.onnx: which one to build would be a guess."""
    root = model_path.parent
    others = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                    if p.suffix.lower() == ".onnx" and p != model_path and p.is_file())
    if others:
        raise ModelRejected(f"bundle holds .onnx files besides {MODEL_NAME}: {', '.join(others[:5])}; "
                            f"a bundle is one {MODEL_NAME} and its external data files")


def inspect_upload(path: Path, workdir: Path, limits: BundleLimits = BundleLimits()) -> InspectedModel:
    """Vet an uploaded file (plain ONNX or bundle, unpacked under workdir); return what it holds."""
    fmt = detect_format(path)
    model_path = path if fmt == "onnx" else _unpack_fresh(path, fmt, workdir, limits)
    try:
        if fmt != "onnx":
            _check_one_model(model_path)
        model, data_files = _load_checked(model_path, fmt)
        _check(model_path)
        return InspectedModel(fmt, model_path, _model_info(model, model_path, data_files))
    except BaseException:
        if fmt != "onnx":
            shutil.rmtree(model_path.parent, ignore_errors=True)  # a rejected bundle leaves nothing behind
        raise


def model_path_for(blob_path: Path, fmt: str, workdir: Path, limits: BundleLimits = BundleLimits()) -> Path:
    """Return the .onnx file a build reads: the blob itself, or model.onnx of the bundle unpacked under workdir."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown model format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "onnx":
        return blob_path
    model_path = _unpack_fresh(blob_path, fmt, workdir, limits)
    # Builders read external data from disk: re-vet the locations even though the upload passed.
    _check_external_data(_load(model_path), model_path.parent)
    return model_path
