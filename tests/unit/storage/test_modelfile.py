"""Upload inspection: plain ONNX files, zip/tar bundles, and every way they are refused."""

from __future__ import annotations

import io
import os
import tarfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginefarm.core.config import Settings
from enginefarm.core.domain import TensorInfo
from enginefarm.core.errors import ModelRejected, PayloadTooLarge
from enginefarm.graph.external import check_external_data
from enginefarm.graph.modelfile import (
    MAX_TENSOR_NAME_BYTES,
    BundleLimits,
    detect_format,
    inspect_upload,
    model_path_for,
    unpack_bundle,
)
from tests.corpus.files import tar_bytes

# --------------------------------------------------------------------------- model builders


def conv_relu(ir_version: int = 8) -> onnx.ModelProto:
    """Conv+Relu with a symbolic batch dim; W is also listed as a graph input (old exporters do)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    w_in = helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3, 3, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, None, 6])
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv_relu", [x, w_in], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir_version)
    model.producer_name, model.producer_version = "pytorch", "2.3.0"
    return model


def qdq() -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Relu -> y, with int64 and float16 extras."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    zp = numpy_helper.from_array(np.array(0, np.int8), "zp")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "qdq", [x], [y], [scale, zp])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx", 17)], ir_version=8)


def qdq_in_subgraph() -> onnx.ModelProto:
    """An If whose then-branch holds the Q/DQ pair; the main graph has none."""
    inner = qdq().graph
    del inner.input[:]  # subgraphs read x from the outer scope
    y2 = helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 16])
    else_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y2"])], "else", [], [y2])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])
    node = helper.make_node("If", ["cond"], ["out"], then_branch=inner, else_branch=else_graph)
    graph = helper.make_graph([node], "if", [cond, x], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def external_dir(tmp_path: Path) -> Path:
    """A folder holding model.onnx plus weights.bin, as onnx writes it."""
    folder = tmp_path / "src"
    folder.mkdir()
    onnx.save_model(
        conv_relu(),
        str(folder / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return folder


def edit_location(model_path: Path, **fields: str) -> bytes:
    """Return model.onnx's bytes with W's external_data entries overridden."""
    model = onnx.load(str(model_path), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key in fields:
            entry.value = fields[entry.key]
    return model.SerializeToString()


def make_zip(path: Path, files: dict[str, bytes] | list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate names some tests need
        with zipfile.ZipFile(path, "w", method) as zf:
            for name, data in files.items() if isinstance(files, dict) else files:
                zf.writestr(name, data)
    return path


def make_tar(path: Path, files: dict[str, bytes], extra: tuple | list = (), mode: str = "w") -> Path:
    path.write_bytes(tar_bytes(files, extra, mode))
    return path


def link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def rejected(path: Path, work: Path, match: str, exc: type = ModelRejected, **kw) -> None:
    with pytest.raises(exc, match=match):
        inspect_upload(path, work, **kw)


# --------------------------------------------------------------------------- accepted uploads


def test_plain_onnx_metadata(tmp_path, work):
    path = save(conv_relu(), tmp_path / "upload.bin")
    got = inspect_upload(path, work)
    assert got.format == "onnx" and got.model_path == path
    info = got.info
    assert info.inputs == [TensorInfo("x", "FLOAT", ["N", 3, 8, 8])]  # W is an initializer, not an input
    # The output's unknown dim is the number shape inference finds (an 8x8 input through a 3x3 conv); "N" stays.
    assert info.outputs == [TensorInfo("y", "FLOAT", ["N", 4, 6, 6])]
    assert info.opset == 17 and info.ir_version == 8
    assert info.producer == "pytorch 2.3.0"
    assert info.size == path.stat().st_size
    assert info.has_qdq is False and info.external_data is False


def test_producer_without_version_is_stripped(tmp_path, work):
    model = conv_relu()
    model.producer_version = ""
    assert inspect_upload(save(model, tmp_path / "m.onnx"), work).info.producer == "pytorch"


def test_name_does_not_pick_the_parser(tmp_path, work):
    # onnx.load would read a *.txt file as textproto; uploads are judged by their bytes.
    path = save(conv_relu(), tmp_path / "model.txt")
    assert inspect_upload(path, work).format == "onnx"


def test_qdq_detected_with_ai_onnx_domain(tmp_path, work):
    info = inspect_upload(save(qdq(), tmp_path / "q.onnx"), work).info
    assert info.has_qdq is True and info.opset == 17
    assert info.inputs == [TensorInfo("x", "FLOAT", [1, 16])]


def test_qdq_detected_in_subgraph(tmp_path, work):
    info = inspect_upload(save(qdq_in_subgraph(), tmp_path / "if.onnx"), work).info
    assert info.has_qdq is True
    assert [t.name for t in info.inputs] == ["cond", "x"] and info.inputs[0].dtype == "BOOL"


def test_zip_bundle_with_external_data(tmp_path, work):
    src = external_dir(tmp_path)
    files = {n: (src / n).read_bytes() for n in ("model.onnx", "weights.bin")}
    bundle = make_zip(tmp_path / "upload.onnx", files)  # named .onnx, still a zip
    assert detect_format(bundle) == "zip"
    got = inspect_upload(bundle, work)
    assert got.format == "zip"
    assert got.model_path.name == "model.onnx" and work in got.model_path.parents
    assert (got.model_path.parent / "weights.bin").read_bytes() == files["weights.bin"]
    assert got.info.external_data is True
    assert got.info.size == len(files["model.onnx"]) + len(files["weights.bin"])
    assert got.info.inputs == [TensorInfo("x", "FLOAT", ["N", 3, 8, 8])]


def test_tar_bundle_in_single_top_folder(tmp_path, work):
    src = external_dir(tmp_path)
    files = {f"resnet/{n}": (src / n).read_bytes() for n in ("model.onnx", "weights.bin")}
    bundle = make_tar(tmp_path / "b.tar", files)
    assert detect_format(bundle) == "tar"
    got = inspect_upload(bundle, work)
    assert got.format == "tar" and got.model_path.name == "model.onnx"
    assert (got.model_path.parent / "weights.bin").is_file()
    assert got.info.external_data is True


def test_gzipped_tar_with_dot_entries(tmp_path, work):
    data = conv_relu().SerializeToString()
    dot = tarfile.TarInfo("./")
    dot.type = tarfile.DIRTYPE
    bundle = make_tar(tmp_path / "b.tgz", {"./model.onnx": data}, [dot], mode="w:gz")
    got = inspect_upload(bundle, work)
    assert got.format == "tar" and got.info.size == len(data)


def test_model_path_for(tmp_path, work):
    plain = save(conv_relu(), tmp_path / "blob")
    assert model_path_for(plain, "onnx", work) == plain
    src = external_dir(tmp_path)
    bundle = make_zip(tmp_path / "blob.zip", {n: (src / n).read_bytes() for n in ("model.onnx", "weights.bin")})
    first = model_path_for(bundle, "zip", work)
    second = model_path_for(bundle, "zip", work)  # each build gets its own folder
    assert first.is_file() and second.is_file() and first != second
    with pytest.raises(ValueError):
        model_path_for(bundle, "rar", work)


def test_unpack_bundle_returns_model_path(tmp_path):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": b"x", "sub/data.bin": b"y"})
    dest = tmp_path / "out"
    assert unpack_bundle(bundle, "zip", dest, BundleLimits()) == dest / "model.onnx"
    assert (dest / "sub" / "data.bin").read_bytes() == b"y"


# --------------------------------------------------------------------------- not ONNX


def test_empty_file(tmp_path, work):
    rejected(save(onnx.ModelProto(), tmp_path / "empty.onnx"), work, "no ir_version")


def test_random_bytes(tmp_path, work):
    path = tmp_path / "r.onnx"
    path.write_bytes(np.random.default_rng(7).bytes(4096))
    rejected(path, work, "not an ONNX model")


def test_random_bytes_many_seeds(tmp_path, work):
    path = tmp_path / "r.onnx"
    for seed in range(50):
        path.write_bytes(np.random.default_rng(seed).bytes(int(64 + seed * 37)))
        with pytest.raises(ModelRejected):
            inspect_upload(path, work)


def test_text(tmp_path, work):
    path = tmp_path / "t.onnx"
    path.write_text("name,value\nlearning_rate,0.01\n" * 20)
    rejected(path, work, "not an ONNX model: the bytes do not parse")


def test_truncated(tmp_path, work):
    data = conv_relu().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) * 2 // 3])
    rejected(path, work, "truncated ONNX file")


def test_proto_without_graph(tmp_path, work):
    path = tmp_path / "g.onnx"
    path.write_bytes(b"\x08\x07")  # ir_version 7 and nothing else
    rejected(path, work, "no graph")


def test_graph_without_nodes(tmp_path, work):
    model = conv_relu()
    del model.graph.node[:]
    rejected(save(model, tmp_path / "n.onnx"), work, "no nodes or no outputs")


def test_ir_version_too_new(tmp_path, work):
    rejected(save(conv_relu(ir_version=onnx.IR_VERSION + 1), tmp_path / "new.onnx"), work, "newer than this server")


def test_checker_unknown_op(tmp_path, work):
    model = conv_relu()
    model.graph.node[1].op_type = "Frobnicate"
    rejected(save(model, tmp_path / "op.onnx"), work, "fails onnx.checker: No Op registered for Frobnicate")


def test_checker_input_without_type(tmp_path, work):
    model = conv_relu()
    model.graph.input[0].ClearField("type")
    rejected(save(model, tmp_path / "t.onnx"), work, "fails onnx.checker: .*'type'")


# --------------------------------------------------------------------------- unsafe bundles


def valid_model_bytes() -> bytes:
    return conv_relu().SerializeToString()


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("../x", "escapes the bundle"),
        ("a/../../x", "escapes the bundle"),
        ("/etc/cron.d/x", "absolute path"),
        ("C:/x", "absolute path"),
        ("..\\..\\x", "backslash"),
    ],
)
def test_zip_bad_names(tmp_path, work, name, match):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": valid_model_bytes(), name: b"x"})
    rejected(bundle, work, match)
    assert list(work.iterdir()) == []  # nothing left behind, nothing written


def test_zip_symlink_entry(tmp_path, work):
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w") as zf:
        zf.writestr("model.onnx", valid_model_bytes())
        info = zipfile.ZipInfo("weights.bin")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    rejected(bundle, work, "'weights.bin' is a symlink")


def test_tar_symlink(tmp_path, work):
    evil = link("weights.bin", "/etc/passwd", tarfile.SYMTYPE)
    bundle = make_tar(tmp_path / "b.tar", {"model.onnx": valid_model_bytes()}, [evil])
    rejected(bundle, work, "symlink to '/etc/passwd'")


def test_tar_hardlink(tmp_path, work):
    evil = link("weights.bin", "/etc/passwd", tarfile.LNKTYPE)
    bundle = make_tar(tmp_path / "b.tar", {"model.onnx": valid_model_bytes()}, [evil])
    rejected(bundle, work, "hard link to '/etc/passwd'")


def test_tar_fifo(tmp_path, work):
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    bundle = make_tar(tmp_path / "b.tar", {"model.onnx": valid_model_bytes()}, [fifo])
    rejected(bundle, work, "device file or fifo")


def test_tar_dotdot(tmp_path, work):
    bundle = make_tar(tmp_path / "b.tar", {"model.onnx": valid_model_bytes(), "../../etc/passwd": b"x"})
    rejected(bundle, work, r"'\.\./\.\./etc/passwd' escapes the bundle")


def test_zip_duplicate_names(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", [("model.onnx", valid_model_bytes()), ("model.onnx", b"other")])
    rejected(bundle, work, "'model.onnx' twice")


def test_zip_duplicate_after_normalizing(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", [("model.onnx", valid_model_bytes()), ("./model.onnx", b"other")])
    rejected(bundle, work, "twice")


def test_file_used_as_folder(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": valid_model_bytes(), "a": b"x", "a/b": b"y"})
    rejected(bundle, work, "which is a file")


def test_too_many_files(tmp_path, work):
    files = {"model.onnx": valid_model_bytes(), **{f"f{i}": b"x" for i in range(5)}}
    rejected(
        make_zip(tmp_path / "b.zip", files),
        work,
        "holds 6 files and folders, over the limit of 3",
        limits=BundleLimits(max_files=3),
    )
    rejected(make_tar(tmp_path / "b.tar", files), work, "over the limit of 3", limits=BundleLimits(max_files=3))


def test_zip_bomb_by_ratio(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": valid_model_bytes(), "zeros.bin": bytes(2 << 20)})
    match = r"'zeros.bin' expands to 2097152 bytes .*compression ratio \d+ over 200"
    rejected(bundle, work, match, exc=PayloadTooLarge)


def test_zip_bomb_of_small_entries_is_refused_before_anything_is_written(tmp_path, work):
    """300 entries of 1 MiB of zeros (each at the per-entry threshold, so none is judged on its own): 300 MiB from
    a third of a megabyte. The whole archive's ratio refuses it at upload, and in the worker before unpacking."""
    files = {"model.onnx": valid_model_bytes(), **{f"shard{i:03d}.bin": bytes(1 << 20) for i in range(300)}}
    bundle = make_zip(tmp_path / "b.zip", files)
    assert bundle.stat().st_size < 400_000
    match = r"the bundle expands to 314\d{6} bytes from \d+: compression ratio \d+ over 200"
    rejected(bundle, work, match, exc=PayloadTooLarge)
    assert list(work.iterdir()) == []
    dest = tmp_path / "unpacked"
    with pytest.raises(PayloadTooLarge, match=match):
        unpack_bundle(bundle, "zip", dest, BundleLimits())
    assert list(dest.iterdir()) == []


def test_unpacked_size_limit_defaults_to_twice_the_upload_limit():
    assert Settings(max_upload_bytes=32 << 20).max_unpacked_bytes == 64 << 20
    assert Settings().max_unpacked_bytes == 16 << 30
    assert Settings(max_upload_bytes=32 << 20, max_unpacked_bytes=5000).max_unpacked_bytes == 5000
    assert BundleLimits.of(Settings(max_upload_bytes=1000)).max_unpacked_bytes == 2000


def test_small_files_may_compress_well(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": valid_model_bytes(), "pad.bin": bytes(1 << 20)})
    assert inspect_upload(bundle, work).format == "zip"


def test_total_unpacked_size(tmp_path, work):
    files = {"model.onnx": valid_model_bytes(), "big.bin": bytes(50_000)}
    bundle = make_zip(tmp_path / "b.zip", files, zipfile.ZIP_STORED)
    rejected(
        bundle,
        work,
        "expands to .* over the limit of 10000",
        exc=PayloadTooLarge,
        limits=BundleLimits(max_unpacked_bytes=10_000),
    )


def test_gzipped_tar_bomb(tmp_path, work):
    bundle = make_tar(tmp_path / "b.tgz", {"model.onnx": valid_model_bytes(), "z": bytes(4 << 20)}, mode="w:gz")
    rejected(bundle, work, r"the bundle expands to \d+ bytes .*compression ratio", exc=PayloadTooLarge)


def test_bundle_without_model(tmp_path, work):
    bundle = make_zip(tmp_path / "b.zip", {"weights.bin": b"x", "nested/deeper/model.onnx": valid_model_bytes()})
    rejected(bundle, work, "no model.onnx at its top level")


def test_corrupt_zip(tmp_path, work):
    data = make_zip(tmp_path / "ok.zip", {"model.onnx": valid_model_bytes()}).read_bytes()
    bad = tmp_path / "bad.zip"
    bad.write_bytes(data[:40])
    rejected(bad, work, "not a readable zip bundle")


def test_unpack_refuses_non_empty_dest(tmp_path):
    bundle = make_zip(tmp_path / "b.zip", {"model.onnx": b"x"})
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "old").write_bytes(b"")
    with pytest.raises(ValueError):
        unpack_bundle(bundle, "zip", dest, BundleLimits())


# --------------------------------------------------------------------------- external data


def bundle_with(tmp_path: Path, **fields: str) -> Path:
    src = external_dir(tmp_path)
    files = {
        "model.onnx": edit_location(src / "model.onnx", **fields),
        "weights.bin": (src / "weights.bin").read_bytes(),
    }
    return make_zip(tmp_path / "b.zip", files)


def test_external_location_dotdot(tmp_path, work):
    (work / "secret").write_bytes(bytes(1000))
    rejected(bundle_with(tmp_path, location="../secret"), work, "location '../secret' for tensor 'W' contains '..'")


def test_external_location_absolute(tmp_path, work):
    rejected(bundle_with(tmp_path, location="/etc/passwd"), work, "location '/etc/passwd' for tensor 'W' is absolute")


def test_external_location_windows_drive(tmp_path, work):
    rejected(bundle_with(tmp_path, location="C:\\Windows\\win.ini"), work, "is absolute")


def test_external_location_missing_file(tmp_path, work):
    rejected(bundle_with(tmp_path, location="nope.bin"), work, "does not hold")


def test_external_range_past_end(tmp_path, work):
    bundle = bundle_with(tmp_path, offset="400", length="432")
    rejected(bundle, work, "spans bytes 400..832 but 'weights.bin' holds only 432")


def test_external_offset_not_integer(tmp_path, work):
    rejected(bundle_with(tmp_path, offset="zero"), work, "not integers")


def test_external_symlink_outside(tmp_path):
    # Bundles cannot carry symlinks (see test_tar_symlink); this checks the last line of defence.
    src = external_dir(tmp_path)
    (tmp_path / "outside.bin").write_bytes((src / "weights.bin").read_bytes())
    (src / "weights.bin").unlink()
    (src / "weights.bin").symlink_to(tmp_path / "outside.bin")
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    with pytest.raises(ModelRejected, match="resolves outside the bundle"):
        check_external_data(model, src)


def test_external_symlink_inside(tmp_path):
    src = external_dir(tmp_path)
    (src / "weights.bin").rename(src / "real.bin")
    (src / "weights.bin").symlink_to("real.bin")
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    with pytest.raises(ModelRejected, match="'weights.bin' for tensor 'W' is a symlink"):
        check_external_data(model, src)


def test_external_hardlink(tmp_path):
    src = external_dir(tmp_path)
    os.link(src / "weights.bin", tmp_path / "alias.bin")
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    with pytest.raises(ModelRejected, match="is a hard link"):
        check_external_data(model, src)


def test_external_tensor_in_node_attribute(tmp_path, work):
    # A Constant's value tensor pointing outside must be caught like an initializer.
    model = conv_relu()
    const = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(4, np.float32), "K"))
    t = const.attribute[0].t
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="/etc/passwd")
    model.graph.node.insert(0, const)
    rejected(
        make_zip(tmp_path / "b.zip", {"model.onnx": model.SerializeToString()}),
        work,
        "'/etc/passwd' for tensor 'K' is absolute",
    )


def test_single_onnx_with_external_data(tmp_path, work):
    src = external_dir(tmp_path)
    rejected(src / "model.onnx", work, "keeps tensors in external files; upload a .zip or .tar bundle")


def test_model_path_for_revets_external_data(tmp_path, work):
    with pytest.raises(ModelRejected, match="is absolute"):
        model_path_for(bundle_with(tmp_path, location="/etc/passwd"), "zip", work)


def test_zip_entry_lying_about_its_size(tmp_path, work):
    # Declare 100 bytes for 300 KB of data in both headers: extraction must not write past 100.
    data = make_zip(tmp_path / "ok.zip", {"big.bin": bytes(300_000), "model.onnx": valid_model_bytes()}).read_bytes()
    patched = bytearray(data)
    patched[22:26] = (100).to_bytes(4, "little")  # local header of the first entry
    central = data.index(b"PK\x01\x02")
    patched[central + 24 : central + 28] = (100).to_bytes(4, "little")
    bundle = tmp_path / "lie.zip"
    bundle.write_bytes(bytes(patched))
    rejected(bundle, work, "not a readable zip bundle: Bad CRC")
    assert list(work.iterdir()) == []  # the partial extraction is removed


def test_external_under_linked_folder(tmp_path):
    src = external_dir(tmp_path)
    (src / "real").mkdir()
    (src / "weights.bin").rename(src / "real" / "weights.bin")
    (src / "sub").symlink_to("real")
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "sub/weights.bin"
    with pytest.raises(ModelRejected, match="'sub/weights.bin' .* lies under one"):
        check_external_data(model, src)


def test_external_in_subfolder_accepted(tmp_path, work):
    src = external_dir(tmp_path)
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "data/weights.bin"
    files = {"model.onnx": model.SerializeToString(), "data/weights.bin": (src / "weights.bin").read_bytes()}
    got = inspect_upload(make_zip(tmp_path / "b.zip", files), work)
    assert got.info.external_data and got.info.size == sum(len(v) for v in files.values())


def test_tar_file_count_ignores_root_entry(tmp_path, work):
    dot = tarfile.TarInfo("./")
    dot.type = tarfile.DIRTYPE
    files = {"./model.onnx": valid_model_bytes(), "./a": b"", "./b": b"", "./c": b""}
    bundle = make_tar(tmp_path / "b.tar", {}, [dot])
    with tarfile.open(bundle, "a") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    rejected(bundle, work, "at least 4 files and folders, over the limit of 3", limits=BundleLimits(max_files=3))


# --------------------------------------------------------------------------- values ONNX Runtime would refuse later


@pytest.mark.parametrize(
    "fields",
    [
        {"offset": " 0 "},
        {"offset": "0 "},
        {"offset": "\u0660"},
        {"offset": "+0"},
        {"offset": "-0"},
        {"offset": ""},
        {"offset": "\uff10"},
        {"length": " 432"},
        {"length": "\u0664\u0663\u0662"},
        {"length": "4_32"},
    ],
)
def test_external_offsets_and_lengths_are_plain_ascii_digits(tmp_path, work, fields):
    """Was broken: Python's int() took these, ONNX Runtime did not, so the upload passed and every build failed."""
    ((key, value),) = fields.items()
    with pytest.raises(ModelRejected) as caught:
        inspect_upload(bundle_with(tmp_path, **fields), work)
    assert f"tensor 'W' are not integers: {key} {value!r} must be plain ASCII digits" in str(caught.value)


def test_external_negative_offset_names_the_tensor(tmp_path, work):
    rejected(bundle_with(tmp_path, offset="-4096"), work, "tensor 'W' are negative: offset '-4096'")


def test_external_plain_digits_accepted(tmp_path, work):
    got = inspect_upload(bundle_with(tmp_path, offset="0", length="432"), work)
    assert got.info.external_data


def relu_model(in_name: str = "x", out_name: str = "y", in_dims=(1, 4), out_dims=(1, 4)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info(in_name, TensorProto.FLOAT, list(in_dims))
    y = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, list(out_dims))
    graph = helper.make_graph([helper.make_node("Relu", [in_name], [out_name])], "relu", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    "model, says",
    [
        (relu_model(in_name="n" * (MAX_TENSOR_NAME_BYTES + 1)), "input 'nnnnnnnn"),
        (relu_model(out_name="\u00e9" * (MAX_TENSOR_NAME_BYTES // 2 + 1)), "output '\u00e9\u00e9\u00e9"),
        (relu_model(in_dims=("b" * (MAX_TENSOR_NAME_BYTES + 1), 4)), "dim name at axis 0 of input 'x'"),
    ],
)
def test_tensor_names_over_the_limit(tmp_path, work, model, says):
    """Was broken: an 8 MiB input name was stored and then shown in every listing and every build log."""
    path = save(model, tmp_path / "m.onnx")
    with pytest.raises(ModelRejected) as caught:
        inspect_upload(path, work)
    message = str(caught.value)
    assert says in message and f"is longer than {MAX_TENSOR_NAME_BYTES} bytes" in message, message[:300]
    assert len(message) < 400  # the name is cut short, not echoed whole


def test_tensor_name_at_the_limit_is_fine(tmp_path, work):
    path = save(relu_model(in_name="n" * MAX_TENSOR_NAME_BYTES), tmp_path / "m.onnx")
    assert inspect_upload(path, work).info.inputs[0].name == "n" * MAX_TENSOR_NAME_BYTES


@pytest.mark.parametrize(
    "model, says",
    [
        (relu_model(in_dims=(-2, 4)), "input 'x' declares dim -2 at axis 0"),
        (relu_model(out_dims=(1, -4)), "output 'y' declares dim -4 at axis 1"),
    ],
)
def test_negative_dims_are_refused(tmp_path, work, model, says):
    rejected(save(model, tmp_path / "m.onnx"), work, says + ".*0 or more")


def test_minus_one_is_a_dynamic_dim(tmp_path, work):
    """paddle2onnx and other exporters write -1 for a dynamic dim (the PaddleOCR models of the real-model corpus)."""
    assert inspect_upload(save(relu_model(in_dims=(-1, 4)), tmp_path / "m.onnx"), work).info.inputs[0].dims[1] == 4
