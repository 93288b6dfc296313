"""Uploaded model files: inspect the ONNX model of a plain file or a bundle (``enginefarm.core.bundle`` unpacks those).

An upload is either a single ``.onnx`` file or a ``.zip``/``.tar`` bundle holding ``model.onnx``
and its external data files. Everything here treats the bytes as hostile: archives may try to
escape their folder or expand without bound, and an ONNX model's external data entries may point
anywhere on disk (``enginefarm.graph.external``). Every rejection raises ``ModelRejected``
(``PayloadTooLarge`` for size limits) with a message the uploader can act on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from onnx import ModelProto, OperatorSetIdProto, TensorProto

from enginefarm.core.bundle import FORMATS, MODEL_NAME, BundleLimits, detect_format, unpack_bundle, unpack_model
from enginefarm.core.domain import ModelInfo, TensorInfo
from enginefarm.core.errors import ModelRejected
from enginefarm.graph.external import all_nodes, check_external_data, uses_external_data
from enginefarm.graph.graphfacts import QDQ_OPS, index_ranges, op_counts

# No builder takes a dimension this large; a model declaring one is broken or hostile.
_MAX_DECLARED_DIM = (1 << 31) - 1
# Graph input and output names (and dim names) are stored with the model, shown in every listing and build log,
# and written into Triton configurations; real exporters stay far below this.
MAX_TENSOR_NAME_BYTES = 1024
_NAME_SHOWN = 40
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class InspectedModel:
    """An accepted upload: its format, its ``.onnx`` file (to build from, unless the bundle's data files were
    left in the archive: ``inspect_upload(..., unpack_data=False)``), and what it holds."""

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


# --------------------------------------------------------------------------- metadata


def _text(value: str | bytes, what: str) -> str:
    """A string field of the proto; protobuf hands back bytes where the field is not valid UTF-8."""
    if isinstance(value, bytes):
        raise ModelRejected(f"{what} {value!r} is not valid UTF-8 text")
    return value


def _short(name: str) -> str:
    return repr(name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "...")


def _check_io(kind: str, values: Iterable[onnx.ValueInfoProto]) -> None:
    """Reject graph input or output names (and their dim names) over MAX_TENSOR_NAME_BYTES, and negative dims: ONNX
    dims are sizes, 0 or more; dynamic ones have a name or no value. Inputs no engine can be fed are rejected too:
    non-tensor types, no element type, absurd dims."""
    for value in values:
        name = _text(value.name, "tensor name")
        if len(name.encode()) > MAX_TENSOR_NAME_BYTES:
            raise ModelRejected(
                f"{kind} {_short(name)} has a name of {len(name.encode())} bytes, which is longer than "
                f"{MAX_TENSOR_NAME_BYTES} bytes; rename it"
            )
        kind_of = value.type.WhichOneof("value")
        if kind == "input" and kind_of != "tensor_type":
            what = (kind_of or "undefined").removesuffix("_type")
            raise ModelRejected(
                f"input {value.name!r} is of type {what}, not a tensor; engines take tensor inputs only"
            )
        if kind == "input" and value.type.tensor_type.elem_type == TensorProto.UNDEFINED:
            raise ModelRejected(f"input {value.name!r} has no element type (UNDEFINED)")
        if kind_of not in ("tensor_type", "sparse_tensor_type"):
            continue
        for axis, d in enumerate(getattr(value.type, kind_of).shape.dim):
            which = d.WhichOneof("value")
            # -1 is how several exporters (paddle2onnx among them) mark a dynamic dim, and runtimes read it so.
            if which == "dim_value" and d.dim_value < -1:
                raise ModelRejected(
                    f"{kind} {_short(name)} declares dim {d.dim_value} at axis {axis}; a dim is a size, "
                    "0 or more, or -1, a name or nothing for a dynamic one"
                )
            if kind == "input" and which == "dim_value" and d.dim_value > _MAX_DECLARED_DIM:
                raise ModelRejected(
                    f"input {value.name!r} declares dim {d.dim_value} at axis {axis}, "
                    f"over the largest buildable dim {_MAX_DECLARED_DIM}"
                )
            param = _text(d.dim_param, f"dim name of {_short(name)}") if which == "dim_param" else ""
            if len(param.encode()) > MAX_TENSOR_NAME_BYTES:
                raise ModelRejected(
                    f"the dim name at axis {axis} of {kind} {_short(name)} is longer than "
                    f"{MAX_TENSOR_NAME_BYTES} bytes; use a short name such as 'batch'"
                )


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


def _default_opset(model: ModelProto) -> int:
    """Return the default-domain opset version the model imports."""
    # protobuf's repeated-field containers are untyped here (no stubs for google.protobuf): the item type is named.
    op: OperatorSetIdProto
    for op in model.opset_import:
        if op.domain in _DEFAULT_DOMAINS:
            return op.version
    raise ModelRejected("model imports no opset for the default ONNX domain")


# Initializers up to this size keep their values for shape inference (the shape tensors a Reshape reads); larger
# ones, the weights, become inputs of their type and dims, so inference never copies the weights.
_SHAPE_TENSOR_BYTES = 4096


def _weightless(model: ModelProto) -> ModelProto:
    """``model`` without its large initializers' bytes: each becomes a graph input of its type and dims."""
    light = ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    graph, source = light.graph, model.graph
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    inputs = {v.name for v in source.input}
    for init in source.initializer:
        if init.ByteSize() <= _SHAPE_TENSOR_BYTES:
            graph.initializer.append(init)
        elif init.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def _static_outputs(model: ModelProto, outputs: list[TensorInfo]) -> list[TensorInfo]:
    """``outputs`` with each dim declared as a name or unknown, but static by ONNX's shape inference with value
    propagation, as that number. The TorchScript exporter names a Reshape's output dims (``Reshapehidden_dim_2``)
    even where they are fixed (a decoder's hidden size 128); Triton's config wants the number."""
    if all(isinstance(d, int) and d > 0 for t in outputs for d in t.dims):
        return outputs
    try:
        inferred = {
            v.name: v for v in onnx.shape_inference.infer_shapes(_weightless(model), data_prop=True).graph.output
        }
    except Exception:  # noqa: BLE001 - an op inference does not know: keep what is declared
        return outputs
    out = []
    for t in outputs:
        value = inferred.get(t.name)
        dims = (
            list(value.type.tensor_type.shape.dim) if value is not None and value.type.HasField("tensor_type") else []
        )
        if len(dims) == len(t.dims):
            t = TensorInfo(
                t.name,
                t.dtype,
                [
                    d
                    if isinstance(d, int) and d > 0
                    else (n.dim_value if n.WhichOneof("value") == "dim_value" and n.dim_value > 0 else d)
                    for d, n in zip(t.dims, dims)
                ],
            )
        out.append(t)
    return out


def _model_info(model: ModelProto, model_path: Path, data_files: dict[Path, int]) -> ModelInfo:
    """Collect the metadata of an accepted model."""
    graph = model.graph
    weights = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    _check_io("input", inputs)
    _check_io("output", graph.output)
    return ModelInfo(
        inputs=[_tensor_info(v) for v in inputs],
        outputs=_static_outputs(model, [_tensor_info(v) for v in graph.output]),
        opset=_default_opset(model),
        ir_version=model.ir_version,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        size=model_path.stat().st_size + sum(data_files.values()),
        has_qdq=any(n.op_type in QDQ_OPS for n in all_nodes(model)),
        external_data=uses_external_data(model),
        op_types=op_counts(all_nodes(model)),
        index_ranges=index_ranges(model.graph),
    )


# --------------------------------------------------------------------------- entry points


def _unpack_fresh(path: Path, fmt: str, workdir: Path, limits: BundleLimits, unpack_data: bool = True) -> Path:
    """Unpack a bundle into a new folder under workdir (only model.onnx, beside stand-ins of the other files,
    unless ``unpack_data``); return its model.onnx path."""
    workdir.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="bundle-", dir=workdir))
    try:
        return (unpack_bundle if unpack_data else unpack_model)(path, fmt, dest, limits)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _load_checked(model_path: Path, fmt: str) -> tuple[ModelProto, dict[Path, int]]:
    """Parse the model and vet its external data; return the proto and its data files."""
    model = _load(model_path)
    if fmt == "onnx" and uses_external_data(model):
        raise ModelRejected(
            "this model keeps tensors in external files; upload a .zip or .tar bundle "
            "with model.onnx and its data files"
        )
    return model, check_external_data(model, model_path.parent)


def _check_one_model(model_path: Path) -> None:
    """Reject a bundle holding other .onnx files besides model.onnx: which one to build would be a guess."""
    root = model_path.parent
    others = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.suffix.lower() == ".onnx" and p != model_path and p.is_file()
    )
    if others:
        raise ModelRejected(
            f"bundle holds .onnx files besides {MODEL_NAME}: {', '.join(others[:5])}; "
            f"a bundle is one {MODEL_NAME} and its external data files"
        )


def inspect_upload(
    path: Path, workdir: Path, limits: BundleLimits = BundleLimits(), *, unpack_data: bool = True
) -> InspectedModel:
    """Vet an uploaded file (plain ONNX or bundle, unpacked under workdir); return what it holds.

    ``unpack_data=False``: a bundle's files are checked as they would be unpacked (every entry read through,
    names, sizes and external-data ranges against them) but only its model.onnx is written, so a large bundle is
    not copied again; the result's ``model_path`` is then fit for inspection, not for a build.
    """
    fmt = detect_format(path)
    model_path = path if fmt == "onnx" else _unpack_fresh(path, fmt, workdir, limits, unpack_data)
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
    check_external_data(_load(model_path), model_path.parent)
    return model_path
