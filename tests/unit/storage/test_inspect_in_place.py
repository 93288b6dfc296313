"""A bundle inspected in place (``inspect_upload(..., unpack_data=False)``, what the API does): the same verdict,
word for word, as unpacking it whole, for every upload of the hostile corpus and for archives that lie about
their bytes; and only model.onnx is written. A build still unpacks the stored bundle whole."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest

from enginefarm.core.bundle import BundleLimits
from enginefarm.core.errors import EnginefarmError
from enginefarm.graph.modelfile import inspect_upload, model_path_for
from tests.corpus import CORPUS, Context
from tests.corpus import files as f

UPLOADS = [e for e in CORPUS if e.category in ("onnx", "bundle", "external-data")]


def _verdict(path: Path, work: Path, unpack_data: bool, limits: BundleLimits = BundleLimits()):
    """What inspection says: ('accepted', format, info) or (error class, message)."""
    work.mkdir()
    try:
        got = inspect_upload(path, work, limits, unpack_data=unpack_data)
    except EnginefarmError as exc:
        assert list(work.iterdir()) == [], "a rejected upload left files behind"
        return type(exc).__name__, str(exc)
    return "accepted", got.format, got.info.to_dict()


def _both(path: Path, tmp: Path, limits: BundleLimits = BundleLimits()):
    unpacked = _verdict(path, tmp / "unpacked", True, limits)
    in_place = _verdict(path, tmp / "in-place", False, limits)
    assert in_place == unpacked
    return in_place


@pytest.mark.parametrize("entry", UPLOADS, ids=[e.id for e in UPLOADS])
def test_corpus_upload_gets_the_same_verdict_in_place(entry, tmp_path):
    request = entry.request(Context(model_id=1, model_name="m", tmp=tmp_path))
    filename, body = request.kwargs["files"]["file"][:2]
    path = tmp_path / "upload"
    path.write_bytes(body)
    verdict = _both(path, tmp_path)
    if entry.status >= 400 and body:
        assert verdict[0] != "accepted" and entry.message in verdict[1], verdict


def _weights_bundle(path: Path, weights: bytes, method: int = zipfile.ZIP_STORED) -> Path:
    valid = f.external("zip")()  # a valid bundle: model.onnx and weights.bin
    with zipfile.ZipFile(io.BytesIO(valid)) as src:
        files = {n: src.read(n) for n in src.namelist()}
    files["extra.bin"] = weights
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_valid_bundle_is_accepted_alike_and_only_model_onnx_is_written(tmp_path):
    bundle = _weights_bundle(tmp_path / "b.zip", bytes(range(256)) * 8192)  # 2 MiB besides the model
    verdict = _both(bundle, tmp_path)
    assert verdict[0] == "accepted" and verdict[1] == "zip"
    work = tmp_path / "look"
    work.mkdir()
    got = inspect_upload(bundle, work, unpack_data=False)
    folder = got.model_path.parent
    assert got.model_path.stat().st_blocks > 0
    stand_in = folder / "extra.bin"
    assert stand_in.stat().st_size == 2 << 20 and stand_in.stat().st_blocks == 0  # its size, none of its bytes
    assert (folder / "weights.bin").stat().st_blocks == 0


def _patch_data(path: Path, name: str, flip_at: int) -> None:
    """Flip one byte of a stored entry's data, leaving every header as it was."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    raw = bytearray(path.read_bytes())
    at = info.header_offset
    name_len, extra_len = struct.unpack_from("<HH", raw, at + 26)  # the local header's name and extra lengths
    raw[at + 30 + name_len + extra_len + flip_at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_corrupted_stored_entry_is_refused_in_place(tmp_path):
    bundle = _weights_bundle(tmp_path / "b.zip", bytes(1 << 20))
    _patch_data(bundle, "extra.bin", 12345)
    verdict = _both(bundle, tmp_path)
    assert verdict == ("ModelRejected", "not a readable zip bundle: Bad CRC-32 for file 'extra.bin'")


def test_an_entry_lying_about_its_size_is_refused_in_place(tmp_path):
    data = bytearray(f.zip_bytes({"big.bin": bytes(300_000), "model.onnx": f.valid_onnx()}))
    data[22:26] = (100).to_bytes(4, "little")  # the first entry's local header
    central = data.index(b"PK\x01\x02")
    data[central + 24 : central + 28] = (100).to_bytes(4, "little")
    bundle = tmp_path / "lie.zip"
    bundle.write_bytes(bytes(data))
    kind, message = _both(bundle, tmp_path)
    assert kind == "ModelRejected" and message.startswith("not a readable zip bundle: Bad CRC")


def test_the_unpacked_size_limit_holds_in_place(tmp_path):
    bundle = _weights_bundle(tmp_path / "b.zip", bytes(3 << 20))
    verdict = _both(bundle, tmp_path, BundleLimits(max_unpacked_bytes=2 << 20))
    assert verdict[0] == "PayloadTooLarge" and "over the limit of 2097152" in verdict[1]


def test_a_build_still_unpacks_the_bundle_whole(tmp_path):
    weights = bytes(range(256)) * 4096
    bundle = _weights_bundle(tmp_path / "b.zip", weights)
    (tmp_path / "look").mkdir()
    assert inspect_upload(bundle, tmp_path / "look", unpack_data=False).format == "zip"
    model = model_path_for(bundle, "zip", tmp_path / "build")
    assert (model.parent / "extra.bin").read_bytes() == weights
    with zipfile.ZipFile(bundle) as zf:
        assert (model.parent / "weights.bin").read_bytes() == zf.read("weights.bin")
