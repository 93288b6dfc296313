"""Hostile upload bodies, built in memory from the valid sample models: ONNX files, bundles, sample sets.

Every builder returns bytes; none touches the caller's disk (bundles with external data are written
to a private temporary folder and read back).
"""

from __future__ import annotations

import gzip
import io
import json
import stat
import struct
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from enginefarm.graph.samples import conv_net

OPSET = [helper.make_opsetid("", 17)]


def valid_onnx(seed: int = 101, **kwargs) -> bytes:
    return conv_net(seed=seed, **kwargs).SerializeToString()


def _model(nodes, inputs, outputs, initializers=(), opsets=None, ir_version: int = 8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=OPSET if opsets is None else opsets)
    model.ir_version = ir_version
    return model


def _vi(name: str, dims, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(dims))


def relu(dims=(1, 4), ir_version: int = 8, opsets=None, in_name: str = "x") -> onnx.ModelProto:
    return _model(
        [helper.make_node("Relu", [in_name], ["y"])],
        [_vi(in_name, dims)],
        [_vi("y", dims)],
        opsets=opsets,
        ir_version=ir_version,
    )


# --------------------------------------------------------------------------- malformed ONNX


def random_bytes(size: int = 64 << 10, seed: int = 2024) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def json_text() -> bytes:
    return json.dumps({"ir_version": 8, "graph": {"node": [{"op_type": "Relu"}]}}).encode()


def textproto() -> bytes:
    """The model in protobuf's text format: readable by onnx.load for *.txt names, not by the farm."""
    return str(conv_net(seed=102)).encode()


def truncated(fraction: float = 0.5) -> bytes:
    data = valid_onnx(103, channels=32)
    return data[: int(len(data) * fraction)]


def gzipped() -> bytes:
    return gzip.compress(valid_onnx(104))


def no_ir_version() -> bytes:
    model = conv_net(seed=105)
    model.ir_version = 0
    return model.SerializeToString()


def ir_version(version: int) -> bytes:
    return relu(ir_version=version).SerializeToString()


def no_graph() -> bytes:
    model = onnx.ModelProto(ir_version=8)
    model.opset_import.extend(OPSET)
    return model.SerializeToString()


def no_nodes() -> bytes:
    return _model([], [_vi("x", [1, 4])], [_vi("x", [1, 4])]).SerializeToString()


def no_outputs() -> bytes:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])], []).SerializeToString()


def unknown_op_in_subgraph() -> bytes:
    """An If whose then-branch calls an op no opset defines."""
    then_g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y2"])], "then", [], [_vi("y2", [1, 4])])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["y2"])], "else", [], [_vi("y2", [1, 4])])
    node = helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)
    return _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [1, 4])], [_vi("out", [1, 4])]).SerializeToString()


def unimported_domain() -> bytes:
    node = helper.make_node("Exfiltrate", ["x"], ["y"], domain="com.evil")
    return _model([node], [_vi("x", [1, 4])], [_vi("y", [1, 4])]).SerializeToString()


def only_custom_domain() -> bytes:
    node = helper.make_node("Exfiltrate", ["x"], ["y"], domain="com.evil")
    return _model(
        [node], [_vi("x", [1, 4])], [_vi("y", [1, 4])], opsets=[helper.make_opsetid("com.evil", 1)]
    ).SerializeToString()


def missing_node_input() -> bytes:
    node = helper.make_node("Add", ["x", "ghost"], ["y"])
    return _model([node], [_vi("x", [1, 4])], [_vi("y", [1, 4])]).SerializeToString()


def cycle() -> bytes:
    nodes = [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    return _model(nodes, [_vi("x", [1, 4])], [_vi("b", [1, 4])]).SerializeToString()


def opset_zero() -> bytes:
    return relu(opsets=[helper.make_opsetid("", 0)]).SerializeToString()


def huge_declared_dim() -> bytes:
    return relu(dims=(1 << 62, 4)).SerializeToString()


def sequence_input() -> bytes:
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("SequenceAt", ["s", "i"], ["y"])
    return _model([node], [seq, _vi("i", [], TensorProto.INT64)], [_vi("y", [1, 4])]).SerializeToString()


def optional_input() -> bytes:
    opt = helper.make_value_info(
        "o", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [1, 4]))
    )
    node = helper.make_node("OptionalHasElement", ["o"], ["y"])
    return _model(
        [node], [opt], [_vi("y", [], TensorProto.BOOL)], opsets=[helper.make_opsetid("", 18)]
    ).SerializeToString()


def undefined_elem_type() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    return _model([node], [_vi("x", [1, 4], TensorProto.UNDEFINED)], [_vi("y", [1, 4])]).SerializeToString()


def invalid_utf8_input_name() -> bytes:
    """An input name that is not UTF-8: protobuf hands it back as bytes, which JSON cannot hold."""
    return relu(in_name="QQQQ").SerializeToString().replace(b"QQQQ", b"\xff\xfeQQ")


def initializer_without_data() -> bytes:
    """A weight declaring 2**60 elements and holding none."""
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 40, 1 << 20])
    node = helper.make_node("Add", ["x", "W"], ["y"])
    return _model([node], [_vi("x", [1, 4])], [_vi("y", [1, 4])], [w]).SerializeToString()


def raw_data_too_short() -> bytes:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    w.raw_data = b"abc"
    node = helper.make_node("Add", ["x", "W"], ["y"])
    return _model([node], [_vi("x", [4, 4])], [_vi("y", [4, 4])], [w]).SerializeToString()


# --------------------------------------------------------------------------- archives


def zip_bytes(
    files: dict[str, bytes], extra: list[tuple[zipfile.ZipInfo, bytes]] = (), compression: int = zipfile.ZIP_DEFLATED
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for info, data in extra:
            zf.writestr(info, data)
    return buf.getvalue()


def zip_duplicate(name: str, first: bytes, second: bytes) -> bytes:
    """Two members with one name (zipfile warns, and writes both)."""
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")
        zf.writestr(name, first)
        zf.writestr(name, second)
    return buf.getvalue()


def zip_symlink() -> bytes:
    link = zipfile.ZipInfo("weights.bin")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    return zip_bytes({"model.onnx": valid_onnx()}, [(link, b"/etc/passwd")])


def zip_encrypted_flag() -> bytes:
    """weights.bin marked encrypted (general purpose flag bit 0, which zipfile will not write itself)."""
    data = bytearray(zip_bytes({"model.onnx": valid_onnx(), "weights.bin": bytes(64)}, compression=zipfile.ZIP_STORED))
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.rfind(signature)  # weights.bin was written last: its headers come last
        struct.pack_into("<H", data, at + flag_at, struct.unpack_from("<H", data, at + flag_at)[0] | 0x1)
    return bytes(data)


def zip_bomb(size: int = 16 << 20) -> bytes:
    return zip_bytes({"model.onnx": valid_onnx(), "weights.bin": bytes(size)})


def zip_bomb_of_small_entries(count: int = 300, size: int = 1 << 20) -> bytes:
    """``count`` entries of ``size`` zeros each: none is over the 1 MiB judged entry by entry, the whole is a bomb
    (300 of 1 MiB: 300 MiB from 0.34 MB, ratio 924)."""
    return zip_bytes({"model.onnx": valid_onnx(), **{f"shards/{i:04d}.bin": bytes(size) for i in range(count)}})


def zip_many_files(count: int = 10_001) -> bytes:
    files = {"model.onnx": valid_onnx(), **{f"shards/{i:05d}.bin": b"" for i in range(count)}}
    return zip_bytes(files, compression=zipfile.ZIP_STORED)


def zip_cut_short() -> bytes:
    data = zip_bytes({"model.onnx": valid_onnx(), "weights.bin": bytes(range(256)) * 64})
    return data[: len(data) - 30]  # the end-of-central-directory record is gone


def empty_zip() -> bytes:
    return zip_bytes({})


def tar_bytes(files: dict[str, bytes], specials: list[tarfile.TarInfo] = (), mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for info in specials:
            tf.addfile(info)
    return buf.getvalue()


def tar_special(name: str, kind: bytes, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return tar_bytes({"model.onnx": valid_onnx()}, [info])


def tar_duplicate() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("model.onnx", valid_onnx()), ("weights.bin", b"a"), ("weights.bin", b"b")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tgz_bomb(size: int = 16 << 20) -> bytes:
    return tar_bytes({"model.onnx": valid_onnx(), "weights.bin": bytes(size)}, mode="w:gz")


def tgz_many_files(count: int = 10_001) -> bytes:
    return tar_bytes({"model.onnx": valid_onnx(), **{f"shards/{i:05d}.bin": b"" for i in range(count)}}, mode="w:gz")


# --------------------------------------------------------------------------- external data


def _set_external(model: onnx.ModelProto, **fields: str) -> None:
    """Rewrite the external-data entries of the model's first initializer."""
    tensor = model.graph.initializer[0]
    entries = {e.key: e.value for e in tensor.external_data}
    entries.update(fields)
    del tensor.external_data[:]
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)


def external_bundle(
    fmt: str = "zip",
    extra: dict[str, bytes] | None = None,
    mutate: Callable[[onnx.ModelProto, int], None] | None = None,
) -> bytes:
    """model.onnx with every weight in weights.bin, optionally tampered with, as a zip or tar."""
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save_model(
            conv_net(seed=131),
            f"{tmp}/model.onnx",
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights.bin",
            size_threshold=0,
        )
        model = onnx.load(f"{tmp}/model.onnx", load_external_data=False)
        weights = Path(tmp, "weights.bin").read_bytes()
    if mutate is not None:
        mutate(model, len(weights))
    files = {"model.onnx": model.SerializeToString(), "weights.bin": weights, **(extra or {})}
    return zip_bytes(files) if fmt == "zip" else tar_bytes(files)


def external(fmt: str = "zip", extra: dict[str, bytes] | None = None, **fields) -> Callable[[], bytes]:
    """A builder of a bundle whose first weight's external-data fields are replaced; values may be
    callables of the weights file's size."""

    def mutate(model: onnx.ModelProto, size: int) -> None:
        _set_external(model, **{k: str(v(size) if callable(v) else v) for k, v in fields.items()})

    return lambda: external_bundle(fmt, extra, mutate)


def external_in_attribute() -> bytes:
    """A Constant node whose value tensor lives outside the bundle."""
    value = numpy_helper.from_array(np.zeros(4, np.float32), "c")
    value.ClearField("raw_data")
    value.data_location = TensorProto.EXTERNAL
    value.external_data.add(key="location", value="../../../../proc/self/environ")
    value.external_data.add(key="length", value="16")
    nodes = [helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])]
    model = _model(nodes, [_vi("x", [4])], [_vi("y", [4])])
    return zip_bytes({"model.onnx": model.SerializeToString()})


def plain_onnx_with_external_data() -> bytes:
    """A single .onnx file whose weights point at a file next to it on the server."""
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save_model(
            conv_net(seed=132),
            f"{tmp}/model.onnx",
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="weights.bin",
            size_threshold=0,
        )
        return Path(tmp, "model.onnx").read_bytes()


# --------------------------------------------------------------------------- samples (.npz)


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def images(n: int = 2, size: int = 32, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((n, 3, size, size)).astype(dtype)


class _OpensAFile:
    """Unpickling this creates ``path``: proof that the server unpickled what it was sent."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def pickled_object_array(marker: Path) -> bytes:
    arr = np.empty(1, dtype=object)
    arr[0] = _OpensAFile(str(marker))
    buf = io.BytesIO()
    np.savez(buf, input=arr)
    return buf.getvalue()


def raw_pickle(marker: Path) -> bytes:
    import pickle

    return pickle.dumps({"input": _OpensAFile(str(marker))})


def bare_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, images())
    return buf.getvalue()


def npz_claiming_size(size: int = 0xF000_0000) -> bytes:
    """A valid .npz whose central directory claims ``size`` unpacked bytes for its array."""
    data = bytearray(npz(input=images()))
    at = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, at + 24, size)
    return bytes(data)
