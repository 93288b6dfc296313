"""POST /v1/models against the real API: accepted uploads, and every rejection with its 4xx and message.

Each rejection also checks that nothing was left in the catalog or the blob store.
"""

from __future__ import annotations

import io
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor

import httpx
import onnx
import pytest
from onnx import TensorProto, helper

from enginefarm.graph.samples import conv_net
from storage import catalog
from storage.blobs import get_blob_store, model_key
from storage.db import session_scope
from tests.helpers import UPLOAD_LIMIT, unique_name


def _state(settings) -> tuple[int, int]:
    """(model rows, blobs): what a rejected upload must leave unchanged."""
    with session_scope(settings) as s:
        _, total = catalog.list_models(s, limit=1)
    return total, len(list(get_blob_store(settings).keys()))


def _onnx_bytes(model=None) -> bytes:
    return (model or conv_net(seed=7)).SerializeToString()


def _zip(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _bundle_with_external_data(tmp_path) -> bytes:
    model = conv_net(seed=8)
    onnx.save_model(
        model,
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    return _zip(
        {"model.onnx": (tmp_path / "model.onnx").read_bytes(), "weights.bin": (tmp_path / "weights.bin").read_bytes()}
    )


def _checker_failure() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.graph.node[0].op_type = "NoSuchOp"  # unknown op in the default domain: the checker refuses it
    return model.SerializeToString()


def _external_outside(tmp_path) -> bytes:
    model = conv_net(seed=9)
    onnx.save_model(
        model,
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    loaded = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    for init in loaded.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../../etc/passwd"
    return _zip({"model.onnx": loaded.SerializeToString(), "weights.bin": (tmp_path / "weights.bin").read_bytes()})


def _tar_with_symlink() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = _onnx_bytes()
        info = tarfile.TarInfo("model.onnx")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("weights.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    return buf.getvalue()


REJECTIONS = [
    # (id, file bytes factory, expected status, substring of the detail)
    ("random-bytes", lambda p: bytes(range(256)) * 20, 422, "not an ONNX model"),
    ("text", lambda p: b"this is not a model\n" * 10, 422, "not an ONNX model"),
    ("truncated", lambda p: _onnx_bytes()[:-300], 422, "truncated"),
    ("checker-failure", lambda p: _checker_failure(), 422, "onnx.checker"),
    ("zip-traversal", lambda p: _zip({"model.onnx": _onnx_bytes(), "../evil.bin": b"x"}), 422, "escapes the bundle"),
    ("zip-absolute", lambda p: _zip({"model.onnx": _onnx_bytes(), "/etc/evil": b"x"}), 422, "absolute"),
    ("zip-no-model", lambda p: _zip({"other.onnx": _onnx_bytes()}), 422, "model.onnx"),
    ("tar-symlink", lambda p: _tar_with_symlink(), 422, "link"),
    ("external-data-outside", _external_outside, 422, "external data"),
    ("over-size-limit", lambda p: b"\0" * (UPLOAD_LIMIT + 1), 413, "larger than the limit"),
]


@pytest.mark.parametrize("make,status,message", [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_rejected_upload_leaves_nothing(api, dist_settings, tmp_path, make, status, message):
    before = _state(dist_settings)
    r = api.post("/v1/models", data={"name": unique_name("bad")}, files={"file": ("upload.bin", make(tmp_path))})
    assert r.status_code == status, r.text
    assert message.lower() in r.json()["detail"].lower(), r.json()
    assert _state(dist_settings) == before
    assert not list((dist_settings.work_dir / "uploads").glob("upload-*")), "spooled upload left behind"


@pytest.mark.parametrize(
    "data,files,message",
    [
        ({"name": "x"}, None, "multipart/form-data"),
        ({}, {"file": ("m.onnx", b"abc")}, "name"),
        ({"name": "has space"}, {"file": ("m.onnx", b"abc")}, "name must be"),
        ({"name": "x"}, {"other": ("m.onnx", b"abc")}, "no 'file' part"),
        ({"name": "x"}, {"file": ("m.onnx", b"")}, "empty"),
    ],
    ids=["not-multipart", "missing-name", "bad-name", "no-file-part", "empty-file"],
)
def test_malformed_form_is_a_clear_4xx(api, dist_settings, data, files, message):
    before = _state(dist_settings)
    r = api.post("/v1/models", data=data, files=files) if files else api.post("/v1/models", data=data)
    assert 400 <= r.status_code < 500, r.text
    body = r.json()
    text = (body["detail"] + " " + " ".join(p["msg"] for p in body.get("problems", []))).lower()
    assert message.lower() in text, body
    assert _state(dist_settings) == before


def test_single_onnx_upload_extracts_metadata(api):
    name = unique_name("meta")
    r = api.post("/v1/models", data={"name": name, "version": "2024.1"}, files={"file": ("m.onnx", _onnx_bytes())})
    assert r.status_code == 201, r.text
    m = r.json()
    assert (m["name"], m["version"], m["format"], m["opset"], m["ir_version"]) == (name, "2024.1", "onnx", 17, 8)
    assert m["inputs"] == [{"name": "input", "dtype": "FLOAT", "dims": ["batch", 3, 32, 32]}]
    assert m["outputs"][0]["name"] == "logits" and m["producer"].startswith("enginefarm-samples")
    assert api.get(f"/v1/models/{m['id']}").json()["sha256"] == m["sha256"]
    # Identical bytes again: 200 with the same model; a new version of other bytes: 201, version 2024.2.
    again = api.post("/v1/models", data={"name": name}, files={"file": ("m.onnx", _onnx_bytes())})
    assert again.status_code == 200 and again.json()["id"] == m["id"]
    other = api.post(
        "/v1/models",
        data={"name": name, "version": "2024.1"},
        files={"file": ("m.onnx", _onnx_bytes(conv_net(seed=99)))},
    )
    assert other.status_code == 409 and "already exists" in other.json()["detail"]


def test_bundle_with_external_data_is_accepted(api, tmp_path):
    r = api.post(
        "/v1/models",
        data={"name": unique_name("bundle")},
        files={"file": ("m.zip", _bundle_with_external_data(tmp_path))},
    )
    assert r.status_code == 201, r.text
    assert r.json()["format"] == "zip" and r.json()["external_data"] is True


def test_same_bytes_stored_once(api, dist_settings):
    data = _onnx_bytes(conv_net(seed=1234))
    a = api.post("/v1/models", data={"name": unique_name("dup")}, files={"file": ("m.onnx", data)}).json()
    blobs = len(list(get_blob_store(dist_settings).keys()))
    b = api.post("/v1/models", data={"name": unique_name("dup")}, files={"file": ("m.onnx", data)}).json()
    assert a["id"] != b["id"] and a["sha256"] == b["sha256"]
    assert len(list(get_blob_store(dist_settings).keys())) == blobs


def test_uploading_the_same_bytes_again_restores_a_missing_blob(api, dist_settings):
    """Was broken: with its blob gone, "already present" left the model unreadable for good. The same bytes
    uploaded again now put the blob back."""
    data = _onnx_bytes(conv_net(seed=4321))
    name = unique_name("repair")
    first = api.post("/v1/models", data={"name": name}, files={"file": ("m.onnx", data)}).json()
    get_blob_store(dist_settings).delete(model_key(first["sha256"]))
    assert api.get(f"/v1/models/{first['id']}/content").status_code >= 400
    again = api.post("/v1/models", data={"name": name}, files={"file": ("m.onnx", data)})
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    content = api.get(f"/v1/models/{first['id']}/content", follow_redirects=True)
    assert content.status_code == 200 and content.content == data


@pytest.mark.parametrize("round_", range(3))
def test_identical_uploads_at_once_make_one_model_whose_bytes_stay(farm, dist_settings, round_):
    """Was data loss: uploads of one file under one name at the same moment made several versions of it, and
    a loser's cleanup deleted the blob the winner's row pointed at (the content read 404, builds failed)."""
    data = _onnx_bytes(conv_net(seed=9000 + round_))
    name = unique_name("race")

    def upload(_: int) -> httpx.Response:
        with httpx.Client(base_url=farm.url, timeout=60, headers=farm.headers) as c:
            return c.post("/v1/models", data={"name": name}, files={"file": ("m.onnx", data)})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(upload, range(8)))
    assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers if a.status_code >= 300]
    assert sorted(a.status_code for a in answers).count(201) == 1
    assert len({a.json()["id"] for a in answers}) == 1
    with session_scope(dist_settings) as s:
        assert len(catalog.find_models(s, name)) == 1
    with httpx.Client(base_url=farm.url, timeout=60, headers=farm.headers) as c:
        content = c.get(f"/v1/models/{answers[0].json()['id']}/content", follow_redirects=True)
    assert content.status_code == 200 and content.content == data
